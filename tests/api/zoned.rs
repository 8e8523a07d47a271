//! Instants in time zones for the calendar tests (`calendar.rs`, `calendar_overrides.rs`),
//! computed with jiff's own calendar arithmetic on the bundled IANA database (the next local
//! midnight, the first instant of a date), never with the service's `limiter::calendar`, so that
//! the tests check the service against an independent computation.

use jiff::civil::Date;
use jiff::tz::{TimeZone, TimeZoneDatabase};
use jiff::{Timestamp, ZonedDateTime};

pub fn zone(name: &str) -> TimeZone {
    TimeZoneDatabase::bundled()
        .get(name)
        .expect("a zone of the bundled database")
}

/// Unix µs of an RFC 3339 instant.
pub fn us(text: &str) -> u64 {
    let t: Timestamp = text.parse().expect("an RFC 3339 instant");
    u64::try_from(t.as_microsecond()).expect("after 1970")
}

/// Unix µs of `zdt`.
pub fn us_of(zdt: &ZonedDateTime) -> u64 {
    u64::try_from(zdt.timestamp().as_microsecond()).expect("after 1970")
}

/// The instant `at_us` in `tz`.
pub fn zoned(at_us: u64, tz: &TimeZone) -> ZonedDateTime {
    Timestamp::from_microsecond(at_us as i64)
        .expect("a representable instant")
        .to_zoned_datetime(tz.clone())
}

/// `zdt` as the service shows an instant: RFC 3339 with its zone's offset.
pub fn shown(zdt: &ZonedDateTime) -> String {
    zdt.timestamp()
        .display_with_offset(zdt.offset())
        .to_string()
}

/// The instant `at_us` as the service shows it in `tz`.
pub fn shown_in(at_us: u64, tz: &TimeZone) -> String {
    shown(&zoned(at_us, tz))
}

/// The first instant of local date `date` in `tz`.
pub fn start_of(date: Date, tz: &TimeZone) -> ZonedDateTime {
    date.to_zoned_datetime(tz.clone())
        .and_then(|z| z.start_of_day())
        .expect("a representable day")
}

/// The next local midnight after `at_us` in `tz`.
pub fn next_midnight(at_us: u64, tz: &TimeZone) -> ZonedDateTime {
    zoned(at_us, tz)
        .tomorrow()
        .and_then(|t| t.start_of_day())
        .expect("a representable day")
}

/// [`next_midnight`] in Unix µs.
pub fn next_midnight_us(at_us: u64, tz: &TimeZone) -> u64 {
    us_of(&next_midnight(at_us, tz))
}

/// The length in µs of the local day that holds `at_us` in `tz`: 23, 24 or 25 hours.
pub fn day_us(at_us: u64, tz: &TimeZone) -> u64 {
    let today = zoned(at_us, tz)
        .start_of_day()
        .expect("a representable day");
    next_midnight_us(at_us, tz) - us_of(&today)
}
