//! The boundaries of calendar periods (issue 28): the day, week, month, quarter or year of a
//! [`Calendar`] that holds an instant. Pure: no I/O, the time is passed in, and the time-zone
//! rules are those of the IANA database built into the binary ([`crate::policy::calendar`]).
//!
//! The rules, which the stores and scripts will take as given (they receive the start and the
//! end as integers):
//! - a period starts at the first instant of its first local date in the calendar's zone: local
//!   midnight, or, when midnight falls in a daylight-saving gap (America/Havana, and
//!   America/Sao_Paulo until 2019), the first instant after the gap (01:00); when midnight is
//!   repeated, the first of the two;
//! - a period holds the instants from its start to the next period's start, whatever their local
//!   date: where a zone stepped back across midnight (America/Goose_Bay, Moncton and St_Johns
//!   in years up to 2010: 00:01 back to 23:01), the minutes of the old date shown again
//!   after the new date began belong to the new date's period, which is then 25 hours long;
//! - a day is one local date; a week starts on `week_start`; a month on `month_day`, or on the
//!   last day of a month shorter than it (an anchor of 31 starts periods on 31 January,
//!   28 or 29 February, 31 March, 30 April…); a quarter on `month_day` of January, April, July
//!   and October, clamped the same way; a year on `month_day` of January;
//! - a period ends where the next one starts, and holds its start but not its end: the instant
//!   exactly at a boundary belongs to the new period;
//! - periods are not of a fixed length: a day is 23 or 25 hours on the days daylight saving
//!   starts or ends (and so are the weeks, months, quarters and years that hold them), and a date
//!   a zone skipped (Pacific/Apia's 30 December 2011) makes the period that would have started on
//!   it empty, so that an instant falls in the next one.

use jiff::civil::Date;
use jiff::tz::TimeZone;
use jiff::{Timestamp, ToSpan};

use crate::policy::calendar::{Calendar, CalendarUnit};

/// Microseconds in a day: the fallback period's length (see [`period`]).
const DAY_US: i64 = 86_400_000_000;
/// How many periods [`period`] steps from the one of the local date to the one that holds the
/// instant: one suffices for every rule of the database; the bound keeps a corrupt rule from
/// looping.
const MAX_STEPS: usize = 4;

/// A calendar period, in Unix microseconds: `start_us <= now_us < end_us` for the `now_us` it was
/// computed for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Period {
    pub start_us: i64,
    pub end_us: i64,
}

impl Period {
    /// The period's length in microseconds: not fixed (a day of a DST change is 23 or 25 hours).
    pub fn len_us(&self) -> i64 {
        self.end_us - self.start_us
    }

    /// The end of the period, when its quota resets, in RFC 3339 with the UTC offset of the
    /// calendar's zone at that instant (`2026-03-30T00:00:00+02:00`). An end beyond the years
    /// jiff represents (-9999 to 9999) is shown as the last (or first) instant it does.
    pub fn resets_at(&self, calendar: &Calendar) -> String {
        rfc3339(self.end_us, Some(calendar))
    }
}

/// The instant `at_us` (Unix microseconds) in RFC 3339: with the UTC offset of `calendar`'s zone
/// at that instant, or in UTC (`Z`) without one; fractions of a second only where there are
/// any. An instant beyond the years jiff represents (-9999 to 9999) is shown as the last (or
/// first) one it does.
pub fn rfc3339(at_us: i64, calendar: Option<&Calendar>) -> String {
    let at = Timestamp::from_microsecond(at_us).unwrap_or(if at_us < 0 {
        Timestamp::MIN
    } else {
        Timestamp::MAX
    });
    match calendar {
        Some(c) => at
            .display_with_offset(c.time_zone().to_offset(at))
            .to_string(),
        None => at.to_string(),
    }
}

/// The period of `calendar` that holds `now_us` (Unix microseconds).
///
/// Total: an instant so near jiff's limits (the years -9999 and 9999) that its period cannot be
/// represented gets the UTC day that holds it; no clock gets there, and within 1990 to 2100 the
/// tests check that the fallback is never taken.
pub fn period(calendar: &Calendar, now_us: i64) -> Period {
    zoned(calendar, now_us).unwrap_or_else(|| {
        let start_us = now_us.saturating_sub(now_us.rem_euclid(DAY_US));
        Period {
            start_us,
            end_us: start_us.saturating_add(DAY_US),
        }
    })
}

fn zoned(calendar: &Calendar, now_us: i64) -> Option<Period> {
    let tz = calendar.time_zone();
    let now = Timestamp::from_microsecond(now_us).ok()?;
    let today = now.to_zoned_datetime(tz.clone()).date();

    let mut start = first_date(calendar, today)?;
    let mut start_us = start_of(start, tz)?;
    // Where a zone steps back across midnight, an instant's local date can be one whose period
    // started before the period of the next date did; step until the period holds `now`.
    for _ in 0..MAX_STEPS {
        if start_us <= now_us {
            break;
        }
        start = step(calendar, start, -1)?;
        start_us = start_of(start, tz)?;
    }
    let mut end = step(calendar, start, 1)?;
    let mut end_us = start_of(end, tz)?;
    for _ in 0..MAX_STEPS {
        if now_us < end_us {
            break;
        }
        (start, start_us) = (end, end_us);
        end = step(calendar, start, 1)?;
        end_us = start_of(end, tz)?;
    }
    (start_us <= now_us && now_us < end_us).then_some(Period { start_us, end_us })
}

/// The first instant of local date `date` in `tz`: midnight, or the first instant after a gap
/// that holds it (jiff's "compatible" disambiguation, as `ZonedDateTime::start_of_day` uses:
/// the later side of a gap, the earlier of a fold).
fn start_of(date: Date, tz: &TimeZone) -> Option<i64> {
    let midnight = date.to_zoned_datetime(tz.clone()).ok()?;
    Some(midnight.timestamp().as_microsecond())
}

/// The first date of the period whose dates hold `date`.
fn first_date(calendar: &Calendar, date: Date) -> Option<Date> {
    match calendar.unit() {
        CalendarUnit::Day => Some(date),
        CalendarUnit::Week => {
            let back = (date.weekday().to_monday_zero_offset()
                - calendar.week_start().to_monday_zero_offset())
            .rem_euclid(7);
            date.checked_sub(i64::from(back).days()).ok()
        }
        CalendarUnit::Month | CalendarUnit::Quarter | CalendarUnit::Year => {
            let months = calendar.unit().months()?;
            let index = month_index(date);
            // The month the period of `date`'s month would start in, then the one before it
            // when `date` comes before its anchor.
            let aligned = index - (index.rem_euclid(12) % months);
            let first = anchor(calendar, aligned)?;
            if date >= first {
                Some(first)
            } else {
                anchor(calendar, aligned - months)
            }
        }
    }
}

/// The first date of the period `by` periods after (or before) the one starting on `start`.
fn step(calendar: &Calendar, start: Date, by: i32) -> Option<Date> {
    match calendar.unit() {
        CalendarUnit::Day => start.checked_add(by.days()).ok(),
        CalendarUnit::Week => start.checked_add((7 * by).days()).ok(),
        CalendarUnit::Month | CalendarUnit::Quarter | CalendarUnit::Year => {
            let months = calendar.unit().months()?;
            // A clamped anchor (28 February for 31) stays in its month, so the month is the
            // period's.
            anchor(calendar, month_index(start) + by * months)
        }
    }
}

/// Months since year 0: `year * 12 + month - 1`.
fn month_index(date: Date) -> i32 {
    i32::from(date.year()) * 12 + i32::from(date.month()) - 1
}

/// The date a month-anchored period starts in month `index` ([`month_index`]): `month_day`, or
/// the month's last day when it is shorter.
fn anchor(calendar: &Calendar, index: i32) -> Option<Date> {
    let year = i16::try_from(index.div_euclid(12)).ok()?;
    let month = i8::try_from(index.rem_euclid(12) + 1).ok()?;
    let first = Date::new(year, month, 1).ok()?;
    let day = i8::try_from(calendar.month_day())
        .ok()?
        .min(first.days_in_month());
    Date::new(year, month, day).ok()
}

#[cfg(test)]
mod tests;
