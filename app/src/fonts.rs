//! Fallback fonts for scripts egui's bundled fonts lack (Chinese, Japanese, Korean): DeepSeek
//! models answer in Chinese as readily as in English, so without a CJK fallback replies would
//! render as boxes. We use a font the system already has rather than shipping a 20 MB one;
//! `DSV4_CHAT_FONT` names a specific file.

use std::path::{Path, PathBuf};

/// Common locations of CJK-capable fonts on Linux distributions, most complete first.
const CANDIDATES: &[&str] = &[
    "/usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc",
    "/usr/share/fonts/noto-cjk/NotoSansCJK-Regular.ttc",
    "/usr/share/fonts/google-noto-cjk/NotoSansCJK-Regular.ttc",
    "/usr/share/fonts/truetype/noto/NotoSansCJK-Regular.ttc",
    "/usr/share/fonts/truetype/wqy/wqy-microhei.ttc",
    "/usr/share/fonts/wqy-microhei/wqy-microhei.ttc",
    "/usr/share/fonts/truetype/wqy/wqy-zenhei.ttc",
    "/usr/share/fonts/truetype/droid/DroidSansFallbackFull.ttf",
    "/usr/share/fonts/truetype/arphic/uming.ttc",
];

/// The first fallback font that exists: the override, else the first known location.
pub fn find_fallback_font(override_path: Option<&Path>, candidates: &[&str]) -> Option<PathBuf> {
    if let Some(p) = override_path.filter(|p| p.is_file()) {
        return Some(p.to_path_buf());
    }
    candidates.iter().map(PathBuf::from).find(|p| p.is_file())
}

/// Adds a CJK fallback to both font families; returns the font used, if any.
pub fn install_fallback_fonts(ctx: &egui::Context) -> Option<PathBuf> {
    let override_path = std::env::var_os("DSV4_CHAT_FONT").map(PathBuf::from);
    let path = find_fallback_font(override_path.as_deref(), CANDIDATES)?;
    let bytes = std::fs::read(&path).ok()?;
    let mut fonts = egui::FontDefinitions::default();
    let name = "cjk-fallback".to_string();
    fonts.font_data.insert(
        name.clone(),
        std::sync::Arc::new(egui::FontData::from_owned(bytes)),
    );
    for family in [egui::FontFamily::Proportional, egui::FontFamily::Monospace] {
        fonts.families.entry(family).or_default().push(name.clone());
    }
    ctx.set_fonts(fonts);
    Some(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn override_wins_then_first_existing_candidate() {
        let dir = tempfile::tempdir().expect("tempdir");
        let a = dir.path().join("a.ttf");
        let b = dir.path().join("b.ttf");
        std::fs::write(&b, b"font").expect("write");
        let cands = [a.to_str().expect("utf8"), b.to_str().expect("utf8")];
        assert_eq!(find_fallback_font(None, &cands), Some(b.clone()));
        std::fs::write(&a, b"font").expect("write");
        assert_eq!(find_fallback_font(Some(&b), &cands), Some(b.clone()));
        assert_eq!(
            find_fallback_font(Some(&dir.path().join("missing")), &cands),
            Some(a)
        );
        assert_eq!(find_fallback_font(None, &["/nonexistent/font.ttf"]), None);
    }
}
