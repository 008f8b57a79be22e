use super::*;
use crate::persist::BackgroundWriter;

fn save_all(store: &ConversationStore) {
    let writer = BackgroundWriter::spawn().unwrap();
    for c in store.all() {
        writer.submit(store.save_job(c.id).unwrap().unwrap());
    }
    drop(writer);
}

#[test]
fn conversations_round_trip_through_disk() {
    let dir = tempfile::tempdir().unwrap();
    let (mut store, problems) = ConversationStore::load(dir.path().to_path_buf());
    assert!(problems.is_empty());
    let id = store.create(ThinkingMode::High);
    let conv = store.get_mut(id).unwrap();
    conv.title = "Rust questions".into();
    conv.system_prompt = "Be brief.".into();
    conv.messages.push(StoredMessage::user("What is a borrow?"));
    let mut reply = StoredMessage::empty_reply();
    reply.content = "A **reference**.".into();
    reply.reasoning = Some("The user asks...".into());
    reply.stats = Some(ReplyStats {
        generated_tokens: 5,
        decode_tok_s: 12.5,
        context_used: 40,
        context_limit: 4096,
        ..ReplyStats::default()
    });
    conv.messages.push(reply);
    let other = store.create(ThinkingMode::Off);
    save_all(&store);

    let (back, problems) = ConversationStore::load(dir.path().to_path_buf());
    assert!(problems.is_empty());
    assert_eq!(back.all().len(), 2);
    assert_eq!(back.get(id), store.get(id));
    assert_eq!(back.get(other), store.get(other));
    assert_eq!(back.get(id).unwrap().context_fill(), Some((40, 4096)));
}

#[test]
fn damaged_file_is_set_aside_and_others_still_load() {
    let dir = tempfile::tempdir().unwrap();
    let (mut store, _) = ConversationStore::load(dir.path().to_path_buf());
    let good = store.create(ThinkingMode::Off);
    save_all(&store);
    std::fs::write(dir.path().join("99.json"), b"{\"id\": 99, \"title\": ").unwrap();

    let (back, problems) = ConversationStore::load(dir.path().to_path_buf());
    assert_eq!(problems.len(), 1);
    assert!(problems[0].message.contains("set aside"), "{problems:?}");
    assert!(back.get(good).is_some());
    assert!(back.get(99).is_none());
    let set_aside = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .any(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("99.json.corrupt-")
        });
    assert!(set_aside);
}

#[test]
fn prompt_skips_empty_replies_and_adds_system_prompt() {
    let mut store = ConversationStore::in_memory();
    let id = store.create(ThinkingMode::Off);
    let conv = store.get_mut(id).unwrap();
    conv.system_prompt = "sys".into();
    conv.messages.push(StoredMessage::user("hi"));
    conv.messages.push(StoredMessage::empty_reply());
    let prompt = conv.prompt();
    assert_eq!(prompt.len(), 2);
    assert_eq!(prompt[0].role, Role::System);
    assert_eq!(prompt[1].content, "hi");
}

#[test]
fn search_matches_titles_case_insensitively() {
    let mut store = ConversationStore::in_memory();
    let a = store.create(ThinkingMode::Off);
    store.get_mut(a).unwrap().title = "Cooking pasta".into();
    let b = store.create(ThinkingMode::Off);
    store.get_mut(b).unwrap().title = "Rust lifetimes".into();
    let found: Vec<_> = store.search("RUST").map(|c| c.id).collect();
    assert_eq!(found, vec![b]);
    assert_eq!(store.search("  ").count(), 2);
}

#[test]
fn titles_are_first_line_and_shortened() {
    assert_eq!(title_from("\n  Hello there \nmore"), "Hello there");
    let long = "a".repeat(100);
    let title = title_from(&long);
    assert!(title.ends_with('…'));
    assert_eq!(title.chars().count(), 41);
}
