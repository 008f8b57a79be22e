//! Hold-back arithmetic shared by the output parser and the stop-string checker: when a
//! stream's tail could be the beginning of a marker, that tail must not be shown yet.

/// Length in bytes of the longest suffix of `text` that is a proper-or-full prefix of any of
/// `patterns` (always on a char boundary, so `text[..len - n]` is valid).
pub(crate) fn partial_suffix_len(text: &str, patterns: &[&str]) -> usize {
    let longest = patterns.iter().map(|p| p.len()).max().unwrap_or(0);
    let from = text.len().saturating_sub(longest);
    (from..text.len())
        .filter(|&i| text.is_char_boundary(i))
        .find(|&i| patterns.iter().any(|p| p.starts_with(&text[i..])))
        .map_or(0, |i| text.len() - i)
}

#[cfg(test)]
mod tests {
    use super::partial_suffix_len;

    #[test]
    fn finds_longest_partial_marker() {
        assert_eq!(partial_suffix_len("abc</th", &["</think>"]), 4);
        assert_eq!(partial_suffix_len("abc", &["</think>"]), 0);
        assert_eq!(partial_suffix_len("a\n\n<", &["\n\n<X", "<Y"]), 3);
        assert_eq!(partial_suffix_len("a\n\n<", &["\n\nX", "<Y"]), 1);
        assert_eq!(partial_suffix_len("é<｜DS", &["<｜DSML｜"]), "<｜DS".len());
        assert_eq!(partial_suffix_len("", &["x"]), 0);
        assert_eq!(partial_suffix_len("x", &[]), 0);
    }
}
