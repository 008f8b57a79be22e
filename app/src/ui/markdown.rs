//! A small Markdown parser for model replies: headings, paragraphs, bullet and numbered lists,
//! block quotes, rules, fenced code blocks, and inline bold / italic / code.
//!
//! It is written for text that is still streaming in: an unclosed code fence runs to the end,
//! and an unclosed `**` or `` ` `` stays literal instead of restyling the rest of the reply.
//! Single line breaks inside a paragraph are kept, as chat UIs usually do.

/// Inline styling of a run of text.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpanStyle {
    pub bold: bool,
    pub italic: bool,
    pub code: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Span {
    pub text: String,
    pub style: SpanStyle,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListMarker {
    Bullet,
    Number(u64),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListItem {
    /// Nesting depth from the indentation (0 = top level).
    pub depth: usize,
    pub marker: ListMarker,
    pub spans: Vec<Span>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Block {
    Heading { level: u8, spans: Vec<Span> },
    Paragraph(Vec<Span>),
    List(Vec<ListItem>),
    Quote(Vec<Span>),
    Code { lang: String, code: String },
    Rule,
}

/// Splits `text` into blocks.
pub fn parse_blocks(text: &str) -> Vec<Block> {
    let lines: Vec<&str> = text.lines().collect();
    let mut blocks = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        let trimmed = line.trim_start();
        if trimmed.is_empty() {
            i += 1;
        } else if let Some(fence) = fence_of(trimmed) {
            i = parse_code(&lines, i, fence, &mut blocks);
        } else if let Some((level, rest)) = heading_of(trimmed) {
            blocks.push(Block::Heading {
                level,
                spans: parse_inline(rest),
            });
            i += 1;
        } else if is_rule(trimmed) {
            blocks.push(Block::Rule);
            i += 1;
        } else if list_item_of(line).is_some() {
            i = parse_list(&lines, i, &mut blocks);
        } else if trimmed.starts_with('>') {
            i = parse_quote(&lines, i, &mut blocks);
        } else {
            i = parse_paragraph(&lines, i, &mut blocks);
        }
    }
    blocks
}

/// The fence string (``` or ~~~, possibly longer) that opens a code block.
fn fence_of(trimmed: &str) -> Option<&str> {
    for fence_char in ['`', '~'] {
        let count = trimmed.chars().take_while(|&c| c == fence_char).count();
        if count >= 3 {
            return Some(&trimmed[..count]);
        }
    }
    None
}

fn parse_code(lines: &[&str], start: usize, fence: &str, blocks: &mut Vec<Block>) -> usize {
    let lang = lines[start].trim_start()[fence.len()..].trim().to_string();
    let mut code_lines = Vec::new();
    let mut i = start + 1;
    while i < lines.len() {
        let trimmed = lines[i].trim();
        if trimmed.starts_with(fence) && trimmed.chars().all(|c| fence.starts_with(c)) {
            i += 1;
            break;
        }
        code_lines.push(lines[i]);
        i += 1;
    }
    blocks.push(Block::Code {
        lang,
        code: code_lines.join("\n"),
    });
    i
}

fn heading_of(trimmed: &str) -> Option<(u8, &str)> {
    let hashes = trimmed.chars().take_while(|&c| c == '#').count();
    let rest = &trimmed[hashes..];
    if (1..=6).contains(&hashes) && (rest.is_empty() || rest.starts_with(' ')) {
        let level = u8::try_from(hashes).ok()?;
        Some((level, rest.trim().trim_end_matches('#').trim_end()))
    } else {
        None
    }
}

fn is_rule(trimmed: &str) -> bool {
    let compact: String = trimmed.chars().filter(|c| !c.is_whitespace()).collect();
    compact.len() >= 3
        && ['-', '*', '_']
            .iter()
            .any(|&m| compact.chars().all(|c| c == m))
}

/// A list item's depth, marker and text, if `line` starts one.
fn list_item_of(line: &str) -> Option<(usize, ListMarker, &str)> {
    let indent = line.len() - line.trim_start().len();
    let trimmed = line.trim_start();
    let depth = indent / 2;
    for bullet in ["- ", "* ", "+ "] {
        if let Some(rest) = trimmed.strip_prefix(bullet) {
            return Some((depth, ListMarker::Bullet, rest));
        }
    }
    let digits = trimmed.chars().take_while(char::is_ascii_digit).count();
    if digits == 0 || digits > 9 {
        return None;
    }
    let after = &trimmed[digits..];
    let rest = after
        .strip_prefix(". ")
        .or_else(|| after.strip_prefix(") "))?;
    let number = trimmed[..digits].parse().ok()?;
    Some((depth, ListMarker::Number(number), rest))
}

fn parse_list(lines: &[&str], start: usize, blocks: &mut Vec<Block>) -> usize {
    let mut items: Vec<(usize, ListMarker, String)> = Vec::new();
    let mut i = start;
    while i < lines.len() {
        let line = lines[i];
        if let Some((depth, marker, rest)) = list_item_of(line) {
            items.push((depth, marker, rest.to_string()));
        } else if !line.trim().is_empty() && line.starts_with(' ') && !items.is_empty() {
            // An indented line continues the previous item.
            if let Some(last) = items.last_mut() {
                last.2.push(' ');
                last.2.push_str(line.trim());
            }
        } else {
            break;
        }
        i += 1;
    }
    let items = items
        .into_iter()
        .map(|(depth, marker, text)| ListItem {
            depth,
            marker,
            spans: parse_inline(&text),
        })
        .collect();
    blocks.push(Block::List(items));
    i
}

fn parse_quote(lines: &[&str], start: usize, blocks: &mut Vec<Block>) -> usize {
    let mut text = Vec::new();
    let mut i = start;
    while i < lines.len() {
        let Some(rest) = lines[i].trim_start().strip_prefix('>') else {
            break;
        };
        text.push(rest.strip_prefix(' ').unwrap_or(rest));
        i += 1;
    }
    blocks.push(Block::Quote(parse_inline(&text.join("\n"))));
    i
}

fn parse_paragraph(lines: &[&str], start: usize, blocks: &mut Vec<Block>) -> usize {
    let mut text = Vec::new();
    let mut i = start;
    while i < lines.len() {
        let line = lines[i];
        let trimmed = line.trim_start();
        let starts_other_block = trimmed.is_empty()
            || fence_of(trimmed).is_some()
            || heading_of(trimmed).is_some()
            || trimmed.starts_with('>')
            || (list_item_of(line).is_some() && !text.is_empty());
        if starts_other_block && !text.is_empty() {
            break;
        }
        text.push(line.trim_end());
        i += 1;
    }
    blocks.push(Block::Paragraph(parse_inline(&text.join("\n"))));
    i
}

/// Splits a paragraph into styled spans.
pub fn parse_inline(text: &str) -> Vec<Span> {
    let mut spans = Vec::new();
    parse_inline_into(text, SpanStyle::default(), &mut spans);
    spans
}

fn parse_inline_into(text: &str, style: SpanStyle, spans: &mut Vec<Span>) {
    let mut plain = String::new();
    let mut rest = text;
    while let Some(c) = rest.chars().next() {
        if let Some((inner, after, kind)) = delimited(rest, plain.chars().last()) {
            push_span(spans, std::mem::take(&mut plain), style);
            match kind {
                Delim::Code => push_span(
                    spans,
                    inner.to_string(),
                    SpanStyle {
                        code: true,
                        ..style
                    },
                ),
                Delim::Bold => parse_inline_into(
                    inner,
                    SpanStyle {
                        bold: true,
                        ..style
                    },
                    spans,
                ),
                Delim::Italic => parse_inline_into(
                    inner,
                    SpanStyle {
                        italic: true,
                        ..style
                    },
                    spans,
                ),
            }
            rest = after;
        } else {
            plain.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    push_span(spans, plain, style);
}

enum Delim {
    Code,
    Bold,
    Italic,
}

/// If `text` opens an inline span that is closed later, returns (inside, after, kind).
fn delimited(text: &str, previous: Option<char>) -> Option<(&str, &str, Delim)> {
    if let Some(body) = text.strip_prefix('`') {
        let end = body.find('`')?;
        return Some((&body[..end], &body[end + 1..], Delim::Code));
    }
    for marker in ["**", "__"] {
        if let Some(body) = text.strip_prefix(marker) {
            let mut end = body.find(marker).filter(|&e| e > 0)?;
            // In `***` closing both bold and italic, the italic closes first (innermost).
            let marker_char = &marker[..1];
            while body[end + 2..].starts_with(marker_char) {
                end += 1;
            }
            return Some((&body[..end], &body[end + 2..], Delim::Bold));
        }
    }
    for marker in ['*', '_'] {
        if let Some(body) = text.strip_prefix(marker) {
            // `snake_case` and `2 * 3` are not emphasis.
            let opens_word = body.chars().next().is_some_and(|c| !c.is_whitespace());
            let inside_word = previous.is_some_and(char::is_alphanumeric);
            if !opens_word || (marker == '_' && inside_word) {
                return None;
            }
            let end = find_single(body, marker).filter(|&e| e > 0)?;
            if body[..end].ends_with(char::is_whitespace) {
                return None;
            }
            return Some((&body[..end], &body[end + 1..], Delim::Italic));
        }
    }
    None
}

/// The first `marker` in `text` that is not half of a doubled (bold) marker, so
/// `*an **inner** word*` closes at the last star.
fn find_single(text: &str, marker: char) -> Option<usize> {
    let bytes = text.as_bytes();
    let m = u8::try_from(u32::from(marker)).ok()?;
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == m {
            if bytes.get(i + 1) == Some(&m) {
                i += 2;
                continue;
            }
            return Some(i);
        }
        i += 1;
    }
    None
}

fn push_span(spans: &mut Vec<Span>, text: String, style: SpanStyle) {
    if text.is_empty() {
        return;
    }
    match spans.last_mut() {
        Some(last) if last.style == style => last.text.push_str(&text),
        _ => spans.push(Span { text, style }),
    }
}

#[cfg(test)]
#[path = "markdown_tests.rs"]
mod tests;
