//! What the crate's figures share: the embedded font, the size of one panel, and the labels of a
//! log axis.

use std::sync::Once;

use plotters::prelude::FontStyle;

/// Width of one panel in pixels.
pub const WIDTH: u32 = 520;
/// Height of one panel in pixels.
pub const HEIGHT: u32 = 440;

/// The PNG needs a font; DejaVu Sans is embedded so the plot renders on machines without fonts.
pub fn register_font() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        for style in [FontStyle::Normal, FontStyle::Bold] {
            // The font is a valid TTF shipped in the crate; a failure would only lose the text.
            let _ = plotters::style::register_font("sans-serif", style, dejavu::sans::regular());
        }
    });
}

/// Labels a log axis at 1, 2 and 5 times a power of ten only, so that labels never crowd.
pub fn nice_log_label(v: f64) -> String {
    let mantissa = v / 10f64.powf(v.log10().floor());
    match [1.0, 2.0, 5.0].iter().any(|m| (mantissa - m).abs() < 0.05) {
        true => format!("{v}"),
        false => String::new(),
    }
}
