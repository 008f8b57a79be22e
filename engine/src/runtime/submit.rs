//! Admitting a submitted turn: encode the conversation, refuse what cannot run, and give the
//! turn a sequence, reusing the conversation's cached prefix when there is one.

use super::turn::Turn;
use super::{Runtime, MAX_IDLE_CONVERSATIONS};
use crate::api::{ChatMessage, Event, Role, SamplingParams, ThinkingMode, TurnId};
use crate::backend::Backend;
use crate::chat::{encode_to_ids, Message, Tokenizer};
use crate::sampler::Sampler;
use crate::sched::prefix::ConversationCache;

/// The chat layer's message for a front-end message.
fn to_chat_message(m: &ChatMessage) -> Message {
    match m.role {
        Role::System => Message::system(m.content.clone()),
        Role::User => Message::user(m.content.clone()),
        Role::Assistant => Message::assistant(m.content.clone(), m.reasoning.clone()),
        Role::Tool => Message::tool(String::new(), m.content.clone()),
    }
}

/// Renders and tokenizes a conversation for generation.
pub fn encode_prompt(
    tokenizer: &Tokenizer,
    messages: &[ChatMessage],
    thinking: ThinkingMode,
) -> Result<Vec<u32>, String> {
    let msgs: Vec<Message> = messages.iter().map(to_chat_message).collect();
    encode_to_ids(tokenizer, &msgs, thinking).map_err(|e| e.to_string())
}

impl Runtime {
    pub(super) fn submit(
        &mut self,
        turn: TurnId,
        conversation: u64,
        messages: &[ChatMessage],
        sampling: SamplingParams,
        thinking: ThinkingMode,
    ) {
        match self.prepare(turn, conversation, messages, sampling, thinking) {
            Ok(t) => self.queue.push_back(t),
            Err(message) => self.emit(Event::TurnFailed { turn, message }),
        }
    }

    fn prepare(
        &mut self,
        turn: TurnId,
        conversation: u64,
        messages: &[ChatMessage],
        sampling: SamplingParams,
        thinking: ThinkingMode,
    ) -> Result<Turn, String> {
        let loaded = self
            .loaded
            .as_mut()
            .ok_or_else(|| "no model is loaded".to_string())?;
        if messages.is_empty() {
            return Err("the conversation is empty".into());
        }
        let prompt = encode_prompt(&loaded.tokenizer, messages, thinking)?;
        let limit = loaded.backend.context_limit();
        if prompt.len() >= limit {
            return Err(format!(
                "the conversation is {} tokens long, over the context limit of {limit} tokens \
                 (raise the maximum context in settings, or start a new conversation)",
                prompt.len()
            ));
        }
        let max_tokens = (sampling.max_tokens as usize).min(limit - prompt.len());
        // The sequence is attached on admission (see `attach_sequence`).
        let seq = UNATTACHED;
        Ok(Turn::new(
            turn,
            conversation,
            seq,
            prompt,
            Sampler::new(sampling),
            thinking,
            &loaded.tokenizer,
            max_tokens,
        ))
    }

    /// A fresh sequence; when the backend is out of sequence slots (a GPU holds a fixed number),
    /// idle conversations' caches are given up, least recently used first.
    fn new_sequence(&mut self) -> Result<crate::backend::SeqId, String> {
        loop {
            let Some(loaded) = self.loaded.as_mut() else {
                return Err("no model is loaded".into());
            };
            match loaded.backend.create_seq() {
                Ok(seq) => return Ok(seq),
                Err(e) => match self.idle.pop_front() {
                    Some((_, cache)) => release_cache(loaded.backend.as_mut(), cache),
                    None => return Err(e.to_string()),
                },
            }
        }
    }

    /// Moves queued turns into the running batch while there is room. A turn whose
    /// conversation has an idle cache takes it over and rewinds it to the common prefix.
    pub(super) fn admit(&mut self) {
        while self.active.len() < self.settings.max_batch.max(1) {
            let Some(mut t) = self.queue.pop_front() else {
                break;
            };
            match self.attach_sequence(&mut t) {
                Ok(()) => self.active.push(t),
                Err(message) => self.emit(Event::TurnFailed {
                    turn: t.id,
                    message,
                }),
            }
        }
    }

    /// Gives an admitted turn its sequence: the conversation's cached one rewound to the common
    /// prefix when possible, else a fresh one (created only now, so queued turns hold no slot).
    fn attach_sequence(&mut self, t: &mut Turn) -> Result<(), String> {
        t.owns_cache = true;
        if let Some(i) = self.idle.iter().position(|(c, _)| *c == t.conversation) {
            if let Some((_, cache)) = self.idle.remove(i) {
                if self.reuse_cache(t, cache) {
                    return Ok(());
                }
            }
        }
        t.seq = self.new_sequence()?;
        Ok(())
    }

    /// Rewinds `cache` to the longest reusable prefix of the turn's prompt and hands it to the
    /// turn; returns `false` (cache released) when nothing is reusable.
    fn reuse_cache(&mut self, t: &mut Turn, mut cache: ConversationCache) -> bool {
        let Some(loaded) = self.loaded.as_mut() else {
            return false;
        };
        let backend = loaded.backend.as_mut();
        let plan = cache.plan(&t.prompt);
        plan.release
            .iter()
            .for_each(|&s| backend.release_snapshot(s));
        let reusable = cache.apply(&plan);
        let restored = match plan.restore {
            Some(snap) => backend.restore(cache.seq, snap).is_ok(),
            None => reusable,
        };
        if !restored || cache.tokens.is_empty() {
            release_cache(backend, cache);
            return false;
        }
        t.seq = cache.seq;
        t.reused = cache.tokens.len();
        t.fed = cache.tokens.len();
        t.state_tokens = cache.tokens;
        t.snapshots = cache.snapshots;
        true
    }

    /// Keeps a finished turn's sequence as its conversation's cache.
    ///
    /// A turn cancelled while queued never had a sequence ([`UNATTACHED`]).
    pub(super) fn retire_sequence(&mut self, t: &Turn) {
        let Some(loaded) = self.loaded.as_mut() else {
            return;
        };
        if t.seq == UNATTACHED {
            return;
        }
        let backend = loaded.backend.as_mut();
        let busy = self.active.iter().any(|o| o.conversation == t.conversation);
        let known = self.idle.iter().any(|(c, _)| *c == t.conversation);
        if !t.owns_cache || busy || known {
            backend.release_seq(t.seq);
            t.snapshots
                .iter()
                .for_each(|&(_, s)| backend.release_snapshot(s));
            return;
        }
        let cache = ConversationCache {
            seq: t.seq,
            tokens: t.state_tokens.clone(),
            snapshots: t.snapshots.clone(),
        };
        self.idle.push_back((t.conversation, cache));
        while self.idle.len() > MAX_IDLE_CONVERSATIONS {
            if let Some((_, old)) = self.idle.pop_front() {
                release_cache(backend, old);
            }
        }
    }
}

/// The sequence id of a turn that has not been admitted yet (backends never hand out 0).
pub(super) const UNATTACHED: crate::backend::SeqId = crate::backend::SeqId(0);

fn release_cache(backend: &mut dyn Backend, cache: ConversationCache) {
    cache
        .snapshots
        .iter()
        .for_each(|&(_, s)| backend.release_snapshot(s));
    backend.release_seq(cache.seq);
}
