use super::*;

fn plain(text: &str) -> Span {
    Span {
        text: text.into(),
        style: SpanStyle::default(),
    }
}

fn styled(text: &str, bold: bool, italic: bool, code: bool) -> Span {
    Span {
        text: text.into(),
        style: SpanStyle { bold, italic, code },
    }
}

#[test]
fn headings_paragraphs_and_rules() {
    let blocks = parse_blocks("# Title\n\nFirst line\nsecond line\n\n---\n### Sub ###");
    assert_eq!(
        blocks,
        vec![
            Block::Heading {
                level: 1,
                spans: vec![plain("Title")]
            },
            Block::Paragraph(vec![plain("First line\nsecond line")]),
            Block::Rule,
            Block::Heading {
                level: 3,
                spans: vec![plain("Sub")]
            },
        ]
    );
    // "#tag" is not a heading.
    assert!(matches!(parse_blocks("#tag")[0], Block::Paragraph(_)));
}

#[test]
fn inline_styles() {
    assert_eq!(
        parse_inline("a **bold** and *it* or `co*de*` end"),
        vec![
            plain("a "),
            styled("bold", true, false, false),
            plain(" and "),
            styled("it", false, true, false),
            plain(" or "),
            styled("co*de*", false, false, true),
            plain(" end"),
        ]
    );
    assert_eq!(
        parse_inline("**bold *both***"),
        vec![
            styled("bold ", true, false, false),
            styled("both", true, true, false)
        ]
    );
}

#[test]
fn italic_may_contain_bold() {
    assert_eq!(
        parse_inline("*an **inner** word*"),
        vec![
            styled("an ", false, true, false),
            styled("inner", true, true, false),
            styled(" word", false, true, false),
        ]
    );
}

#[test]
fn unclosed_and_non_emphasis_markers_stay_literal() {
    assert_eq!(
        parse_inline("still **streaming"),
        vec![plain("still **streaming")]
    );
    assert_eq!(parse_inline("a `tick"), vec![plain("a `tick")]);
    assert_eq!(
        parse_inline("snake_case_name"),
        vec![plain("snake_case_name")]
    );
    assert_eq!(parse_inline("2 * 3 * 4"), vec![plain("2 * 3 * 4")]);
}

#[test]
fn lists_bullets_numbers_nesting_and_continuations() {
    let blocks = parse_blocks("- one\n- two\n  more\n  - nested\n1. first\n2) second\n\nafter");
    let Block::List(items) = &blocks[0] else {
        panic!("expected a list: {blocks:?}");
    };
    assert_eq!(items.len(), 5);
    assert_eq!(items[1].spans, vec![plain("two more")]);
    assert_eq!(items[2].depth, 1);
    assert_eq!(items[3].marker, ListMarker::Number(1));
    assert_eq!(items[4].marker, ListMarker::Number(2));
    assert_eq!(blocks[1], Block::Paragraph(vec![plain("after")]));
}

#[test]
fn fenced_code_keeps_text_verbatim() {
    let blocks = parse_blocks("Look:\n```rust\nfn main() {\n    **not bold**\n}\n```\nDone");
    assert_eq!(blocks.len(), 3);
    assert_eq!(
        blocks[1],
        Block::Code {
            lang: "rust".into(),
            code: "fn main() {\n    **not bold**\n}".into()
        }
    );
    assert_eq!(blocks[2], Block::Paragraph(vec![plain("Done")]));
}

#[test]
fn unclosed_fence_runs_to_the_end_while_streaming() {
    let blocks = parse_blocks("~~~~\nline 1\n```\nline 2");
    assert_eq!(
        blocks,
        vec![Block::Code {
            lang: String::new(),
            code: "line 1\n```\nline 2".into()
        }]
    );
}

#[test]
fn quotes_merge_lines() {
    let blocks = parse_blocks("> a\n> *b*\nplain");
    assert_eq!(
        blocks[0],
        Block::Quote(vec![plain("a\n"), styled("b", false, true, false)])
    );
    assert_eq!(blocks[1], Block::Paragraph(vec![plain("plain")]));
}

#[test]
fn empty_text_has_no_blocks() {
    assert!(parse_blocks("").is_empty());
    assert!(parse_blocks("\n\n  \n").is_empty());
}
