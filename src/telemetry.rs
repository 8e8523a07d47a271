//! Logging set-up: `tracing` to standard error, filtered by `RUST_LOG` (default `info`), as
//! text or as JSON lines.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

use crate::config::LogSettings;

/// Installs the global subscriber. Safe to call more than once (later calls do nothing).
pub fn init(settings: &LogSettings) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    let _ = if settings.format == "json" {
        builder
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .try_init()
    } else {
        builder.try_init()
    };
}
