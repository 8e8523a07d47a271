//! Logging set-up: `tracing` to standard error, filtered by `RUST_LOG` (default `info`), as
//! text or as JSON lines, beside the OpenTelemetry layer when traces are exported (`trace`); and
//! [`Summarized`], which turns a flood of repeated events into one
//! line per second with a count.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

use crate::config::{LogFormat, LogSettings};
use crate::trace::TraceLayer;

/// Installs the global subscriber, with `traces` beside the logs when given. Safe to call more
/// than once (later calls do nothing).
pub fn init(settings: &LogSettings, traces: Option<TraceLayer>) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    if let Some(traces) = traces {
        // The logs keep their own filter (RUST_LOG), the traces theirs (`trace::start`).
        let logs = tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_ansi(std::io::stderr().is_terminal());
        let logs = if settings.format == LogFormat::Json {
            logs.json()
                .with_current_span(true)
                .with_span_list(false)
                .with_filter(filter)
                .boxed()
        } else {
            logs.with_filter(filter).boxed()
        };
        let _ = tracing_subscriber::registry()
            .with(traces)
            .with(logs)
            .try_init();
        return;
    }
    // Without traces, the subscriber the service always had: one global filter, so that a span
    // below it costs one level check.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    let _ = if settings.format == LogFormat::Json {
        builder
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .try_init()
    } else {
        builder.try_init()
    };
}

/// Counts repeated events so that a caller logs one line per interval with a count instead of
/// one line per event (a Redis outage can produce tens of thousands of degraded decisions a
/// second).
///
/// ```
/// # use ratelimiter::telemetry::Summarized;
/// static DEGRADED: Summarized = Summarized::per_second();
/// if let Some(count) = DEGRADED.hit() {
///     tracing::warn!(count, "decisions degraded since the last line");
/// }
/// ```
///
/// Lock-free: two atomics, and one compare-and-swap per interval.
#[derive(Debug)]
pub struct Summarized {
    interval_ms: u64,
    /// Events not reported yet.
    pending: AtomicU64,
    /// When the last line was allowed, in ms since [`process_start`]; `u64::MAX` before any.
    last_ms: AtomicU64,
}

impl Summarized {
    /// One line per second at most.
    pub const fn per_second() -> Self {
        Self::every(Duration::from_secs(1))
    }

    pub const fn every(interval: Duration) -> Self {
        Self {
            interval_ms: interval.as_millis() as u64,
            pending: AtomicU64::new(0),
            last_ms: AtomicU64::new(u64::MAX),
        }
    }

    /// Counts one event; `Some(n)` when a line is due, `n` being the events since the last line
    /// (this one included). The first event is reported at once.
    pub fn hit(&self) -> Option<u64> {
        let now = u64::try_from(process_start().elapsed().as_millis()).unwrap_or(u64::MAX - 1);
        self.hit_at(now)
    }

    /// [`Summarized::hit`] at `now_ms`, a monotonic time in milliseconds.
    pub fn hit_at(&self, now_ms: u64) -> Option<u64> {
        self.pending.fetch_add(1, Ordering::Relaxed);
        let last = self.last_ms.load(Ordering::Relaxed);
        let due = last == u64::MAX || now_ms.saturating_sub(last) >= self.interval_ms;
        if !due {
            return None;
        }
        // Of the callers that see a line due, only the one that moves the clock reports.
        self.last_ms
            .compare_exchange(last, now_ms, Ordering::AcqRel, Ordering::Relaxed)
            .ok()?;
        Some(self.pending.swap(0, Ordering::AcqRel))
    }
}

/// A fixed instant early in the process, the origin of [`Summarized`]'s clock.
fn process_start() -> Instant {
    static START: OnceLock<Instant> = OnceLock::new();
    *START.get_or_init(Instant::now)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeated_events_give_one_line_per_interval_with_their_count() {
        let s = Summarized::every(Duration::from_millis(1_000));
        // The first event is reported at once.
        assert_eq!(s.hit_at(5_000), Some(1));
        // 999 more within the same second: no line.
        for t in 0..999 {
            assert_eq!(s.hit_at(5_001 + t), None);
        }
        // The first event a second after the last line reports all of them.
        assert_eq!(s.hit_at(6_000), Some(1_000));
        assert_eq!(s.hit_at(6_500), None);
        assert_eq!(s.hit_at(6_999), None);
        assert_eq!(s.hit_at(7_000), Some(3));
        // After a quiet spell, the next event is reported at once, alone.
        assert_eq!(s.hit_at(60_000), Some(1));
    }

    #[test]
    fn concurrent_events_are_each_counted_once() {
        let s = std::sync::Arc::new(Summarized::every(Duration::from_millis(10)));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let s = s.clone();
                std::thread::spawn(move || {
                    (0..10_000u64)
                        .filter_map(|i| s.hit_at(i / 100))
                        .sum::<u64>()
                })
            })
            .collect();
        let reported: u64 = threads.into_iter().map(|t| t.join().expect("thread")).sum();
        let unreported = s.pending.load(Ordering::Relaxed);
        assert_eq!(reported + unreported, 40_000);
    }
}
