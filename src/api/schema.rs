//! The OpenAPI schemas the derives cannot state, built from the same constants as the checks.
//!
//! A policy document: one object per algorithm in the flat form, one for a concurrency policy
//! (flat form only) and one in the `limits` form, each with no properties but its own, its
//! fields' bounds from the algorithms' own descriptions ([`crate::limiter::Field`], and
//! [`crate::policy::concurrency`]'s), so that the schema says what
//! [`crate::policy::parse_policy`] accepts. Two variants: [`PolicyDoc`] (`POST` and every answer; `name` required) and
//! [`PolicyReplacement`] (`PUT`; `name` may be left out, the path gives it). `null` stands for a
//! field left out, as the parser reads it. What JSON Schema cannot say is in the descriptions:
//! limit names unique within their policy, a `PUT` body's `name` equal to the path's, and
//! lengths in bytes where the schema can only count characters.
//!
//! Also the parameters whose patterns come from the server's own rules: a policy name in a path,
//! the `If-Match`/`If-None-Match` preconditions, an acquire's `policy` and `cost`, and a lease's
//! id, `cost` and `lease_ms`.

use std::borrow::Cow;

use serde_json::Value;
use utoipa::openapi::path::{Parameter, ParameterBuilder, ParameterIn};
use utoipa::openapi::schema::{
    AdditionalProperties, AnyOfBuilder, ArrayBuilder, Object, ObjectBuilder, OneOfBuilder, Ref,
    Schema, SchemaType, Type,
};
use utoipa::openapi::{RefOr, Required};
use utoipa::{IntoParams, PartialSchema, ToSchema};

use super::leases::LeasePath;
use super::policies::PolicyPath;
use crate::limiter::concurrency::{MAX_LEASE_MS, MAX_LIMIT};
use crate::limiter::reservation::LONGEST_WAIT_MS;
use crate::limiter::Field;
use crate::policy::calendar::{self, CalendarUnit, MAX_MONTH_DAY};
use crate::policy::descriptor::{MAX_DESCRIPTOR_TEXT, MAX_ENTRIES};
use crate::policy::request_limits::Unit;
use crate::policy::tiers::MAX_TIERS;
use crate::policy::{
    concurrency, near_limit, Algorithm, FailMode, Mode, PolicyDoc, MAX_DESCRIPTION_BYTES,
    MAX_KEY_BYTES, MAX_LIMITS, MAX_UNITS, NAME_PATTERN,
};
use crate::service::lease_id::{LEASE_ID_PATTERN, MAX_LEASE_ID_BYTES};

/// Named schemas, as [`ToSchema::schemas`] collects them into `components.schemas`.
type Components = Vec<(String, RefOr<Schema>)>;

/// `{"$ref": "#/components/schemas/<name>"}`.
fn reference(name: &str) -> RefOr<Schema> {
    RefOr::Ref(Ref::from_schema_name(name))
}

/// The named schema `name`, or `null` for "left out", described at the property.
fn reference_or_null(name: &str, description: Option<String>) -> OneOfBuilder {
    OneOfBuilder::new()
        .item(reference(name))
        .item(ObjectBuilder::new().schema_type(Type::Null))
        .description(description)
}

/// `fixed_window` as `FixedWindow`: the start of an algorithm's schema names.
fn pascal(snake: &str) -> String {
    snake
        .split('_')
        .map(|part| {
            let mut chars = part.chars();
            chars.next().map_or_else(String::new, |first| {
                first.to_ascii_uppercase().to_string() + chars.as_str()
            })
        })
        .collect()
}

/// Adds `name` to `components` unless it is there already.
fn add(components: &mut Components, name: String, schema: impl Into<RefOr<Schema>>) {
    if components.iter().all(|(n, _)| *n != name) {
        components.push((name, schema.into()));
    }
}

/// A string, or `null` for "left out".
fn nullable_string() -> SchemaType {
    SchemaType::from_iter([Type::String, Type::Null])
}

fn name(description: &str, nullable: bool) -> ObjectBuilder {
    ObjectBuilder::new()
        .schema_type(if nullable {
            nullable_string()
        } else {
            Type::String.into()
        })
        .pattern(Some(NAME_PATTERN))
        .description(Some(format!("{description}: `{NAME_PATTERN}`")))
        .examples(["api-per-user"])
}

/// Whether a policy's or a limit's `name` must be given.
#[derive(Clone, Copy, PartialEq, Eq)]
enum NameIs {
    Required,
    Optional,
}

/// A form of rate limit: an algorithm, with its periods on the calendar (`calendar` in place of
/// `window_ms`, `fixed_window` only) or not.
#[derive(Clone, Copy)]
struct Form {
    algorithm: Algorithm,
    calendar: bool,
}

impl Form {
    /// Every algorithm's own form, then the calendar `fixed_window`.
    fn all() -> impl Iterator<Item = Form> {
        Algorithm::ALL
            .into_iter()
            .map(|algorithm| Form {
                algorithm,
                calendar: false,
            })
            .chain([Form {
                algorithm: Algorithm::FixedWindow,
                calendar: true,
            }])
    }

    /// `fixed_window`, or `fixed_window_calendar`: what its schemas are named after.
    fn name(self) -> String {
        match self.calendar {
            false => self.algorithm.as_str().to_owned(),
            true => format!("{}_{}", self.algorithm.as_str(), calendar::FIELD),
        }
    }

    /// The words for it in a description.
    fn words(self) -> String {
        match self.calendar {
            false => format!("`{}`", self.algorithm.as_str()),
            true => format!("calendar `{}`", self.algorithm.as_str()),
        }
    }
}

/// An object holding `algorithm` and the fields of `form` (a calendar limit's `limit` and
/// `calendar`), plus `extra`; no other property.
fn limit_object(form: Form, extra: ObjectBuilder, components: &mut Components) -> ObjectBuilder {
    let fields = form.algorithm.fields();
    if !form.calendar {
        return kind_object(form.algorithm.as_str(), fields, extra);
    }
    let name = calendar_schema(components);
    kind_object(form.algorithm.as_str(), &fields[..1], extra)
        .property(calendar::FIELD, reference(&name))
        .required(calendar::FIELD)
}

/// One object of `Calendar`: its schema's name, its units, and the anchor they take.
type CalendarVariant<'a> = (
    &'a str,
    &'a [CalendarUnit],
    Option<(&'a str, ObjectBuilder)>,
);

/// `Calendar`, added to `components`: a calendar limit's periods, as
/// [`crate::policy::calendar::Calendar::parse`] reads them. One object per set of units that
/// share their anchors (`CalendarDay`, `CalendarWeek`, `CalendarMonths`), so that the schema
/// refuses an anchor given to a unit that does not use it, as the server does (422).
fn calendar_schema(components: &mut Components) -> String {
    let name = "Calendar".to_owned();
    let days = [
        "monday",
        "tuesday",
        "wednesday",
        "thursday",
        "friday",
        "saturday",
        "sunday",
    ];
    let week_start = ObjectBuilder::new()
        .schema_type(Type::String)
        .enum_values(Some(days))
        .description(Some(
            "The day a week starts (default `monday`, as ISO 8601)",
        ));
    let month_day = ObjectBuilder::new()
        .schema_type(Type::Integer)
        .minimum(Some(1))
        .maximum(Some(u64::from(MAX_MONTH_DAY)))
        .description(Some(format!(
            "The day of the month a period starts (1 to {MAX_MONTH_DAY}, default 1); in a month \
             shorter than it, its last day. A quarter starts in January, April, July and \
             October, a year in January"
        )));
    let variants: [CalendarVariant; 3] = [
        ("CalendarDay", &[CalendarUnit::Day], None),
        (
            "CalendarWeek",
            &[CalendarUnit::Week],
            Some(("week_start", week_start)),
        ),
        (
            "CalendarMonths",
            &[
                CalendarUnit::Month,
                CalendarUnit::Quarter,
                CalendarUnit::Year,
            ],
            Some(("month_day", month_day)),
        ),
    ];
    debug_assert!(CalendarUnit::ALL
        .iter()
        .all(|u| variants.iter().any(|(_, units, _)| units.contains(u))));
    let mut one_of = OneOfBuilder::new().description(Some(
        "The limit's windows are periods of the calendar in a time zone, in place of \
         `window_ms`: each starts at the first instant of its first day there (local \
         midnight; the first instant after a daylight-saving gap that skips it), so a day \
         is 23 or 25 hours on the days the clocks change. `RateLimit-Policy`'s `w` is the \
         current period's length. An anchor is given only with the units it starts: \
         `week_start` with `week`, `month_day` with `month`, `quarter` and `year`.",
    ));
    for (variant, units, anchor) in variants {
        let units: Vec<&str> = units.iter().map(|u| u.as_str()).collect();
        let mut o = ObjectBuilder::new()
            .schema_type(Type::Object)
            .property(
                "unit",
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .enum_values(Some(units))
                    .description(Some("The period")),
            )
            .required("unit")
            .property(
                "time_zone",
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .description(Some(
                        "An IANA time-zone name (`Europe/Berlin`, `Asia/Kolkata`, `UTC`), in \
                         any ASCII case; read back as the database spells it",
                    ))
                    .examples(["Europe/Berlin"]),
            )
            .required("time_zone");
        if let Some((field, schema)) = anchor {
            o = o.property(field, schema);
        }
        let o = o.additional_properties(Some(AdditionalProperties::FreeForm(false)));
        add(components, variant.to_owned(), o.build());
        one_of = one_of.item(reference(variant));
    }
    add(components, name.clone(), Schema::OneOf(one_of.build()));
    name
}

/// An object holding `algorithm`, which is `kind`, and `fields`, plus `extra`; no other
/// property.
fn kind_object(kind: &str, fields: &[Field], extra: ObjectBuilder) -> ObjectBuilder {
    let mut o = extra
        .property(
            "algorithm",
            ObjectBuilder::new()
                .schema_type(Type::String)
                .enum_values(Some([kind])),
        )
        .required("algorithm");
    for f in fields {
        o = o
            .property(
                f.name,
                ObjectBuilder::new()
                    .schema_type(Type::Integer)
                    .minimum(Some(f.min))
                    .maximum(Some(f.max))
                    .description(Some(format!("{} ({} to {})", f.doc, f.min, f.max)))
                    .examples([f.example]),
            )
            .required(f.name);
    }
    o.additional_properties(Some(AdditionalProperties::FreeForm(false)))
}

/// The schema name of one limit of `form` inside `limits`: `FixedWindowLimit` (one of
/// several, named) or `FixedWindowSoleLimit` (the only one, whose name may be left out).
fn limit_schema_name(form: Form, name_is: NameIs) -> String {
    match name_is {
        NameIs::Required => format!("{}Limit", pascal(&form.name())),
        NameIs::Optional => format!("{}SoleLimit", pascal(&form.name())),
    }
}

/// One limit inside `limits`, of any algorithm: `Limit` (one of several) or `SoleLimit` (the
/// only one), a choice of one named schema per algorithm, each added to `components`.
fn limit(name_is: NameIs, components: &mut Components) -> RefOr<Schema> {
    let (union, description) = match name_is {
        NameIs::Required => ("Limit", "The limit's name, unique within its policy"),
        NameIs::Optional => (
            "SoleLimit",
            "The limit's name; left out, it is the policy's",
        ),
    };
    let mut one_of = OneOfBuilder::new().description(Some(match name_is {
        NameIs::Required => "One of several limits of a policy, of any algorithm, named",
        NameIs::Optional => {
            "The only limit of a policy's `limits`, of any algorithm; its name may be left out"
        }
    }));
    for form in Form::all() {
        let mut o = ObjectBuilder::new()
            .schema_type(Type::Object)
            .description(Some(format!("A {} limit", form.words())))
            .property("name", name(description, name_is == NameIs::Optional));
        if name_is == NameIs::Required {
            o = o.required("name");
        }
        let variant = limit_schema_name(form, name_is);
        one_of = one_of.item(reference(&variant));
        let object = limit_object(form, o, components).build();
        add(components, variant, object);
    }
    add(components, union.to_owned(), Schema::OneOf(one_of.build()));
    reference(union)
}

/// `fail_mode`: the enum of [`FailMode`], or `null` for the default.
fn fail_mode(components: &mut Components) -> OneOfBuilder {
    add(
        components,
        FailMode::name().into_owned(),
        FailMode::schema(),
    );
    reference_or_null(
        &FailMode::name(),
        Some(
            "What the service answers for this policy while its store cannot be reached: \
             `open` (allow, marked `\"degraded\": true`), `closed` (503 with `Retry-After`) \
             or `local` (decide in this instance until the store is back, marked degraded). \
             `open` when left out."
                .into(),
        ),
    )
}

/// `mode`: the enum of [`Mode`], or `null` for the default.
fn mode(components: &mut Components) -> OneOfBuilder {
    add(components, Mode::name().into_owned(), Mode::schema());
    reference_or_null(
        &Mode::name(),
        Some(
            "`enforce` (denials are denials) or `shadow`: every acquire is decided and \
             counted exactly as in `enforce`, a would-be denial taking nothing, but answered \
             as allowed with `\"shadow\": true` and what enforcement would have answered \
             (`would_allow`, `retry_after_ms`, `violated`). `enforce` when left out, unless \
             the service runs with `limits.shadow` set, which puts every policy in shadow \
             mode."
                .into(),
        ),
    )
}

/// A concurrency policy's `mode`: `enforce` only (shadow mode is refused for them), or `null`.
fn concurrency_mode() -> OneOfBuilder {
    OneOfBuilder::new()
        .item(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .enum_values(Some([Mode::Enforce.as_str()])),
        )
        .item(ObjectBuilder::new().schema_type(Type::Null))
        .description(Some(
            "`enforce`, or left out: shadow mode is not supported for concurrency policies (422)",
        ))
}

/// `name`, `description`, `fail_mode` and `mode`, common to both forms.
fn policy_object(
    description: String,
    name_is: NameIs,
    components: &mut Components,
) -> ObjectBuilder {
    let o = ObjectBuilder::new()
        .schema_type(Type::Object)
        .description(Some(description));
    let o = match name_is {
        NameIs::Required => o
            .property("name", name("Unique policy name", false))
            .required("name"),
        NameIs::Optional => o.property(
            "name",
            name(
                "The policy's name, as in the path; may be left out, and must equal the path's \
                 name when given",
                true,
            ),
        ),
    };
    o.property(
        "description",
        ObjectBuilder::new()
            .schema_type(nullable_string())
            .max_length(Some(MAX_DESCRIPTION_BYTES))
            .description(Some(format!(
                "Free text for operators, at most {MAX_DESCRIPTION_BYTES} bytes of UTF-8"
            ))),
    )
    .property("fail_mode", fail_mode(components))
    .property("mode", mode(components))
}

/// [`policy_object`] of a rate policy, which may serve Envoy descriptors.
fn rate_policy_object(
    description: String,
    name_is: NameIs,
    components: &mut Components,
) -> ObjectBuilder {
    let descriptor = descriptor(components);
    let tiers = tiers(components);
    policy_object(description, name_is, components)
        .property("descriptor", descriptor)
        .property("tiers", tiers)
        .property(near_limit::FIELD, near_limit_ratio())
}

/// `near_limit_ratio`: a number in (0, 1], from the bounds the check reads.
fn near_limit_ratio() -> ObjectBuilder {
    ObjectBuilder::new()
        .schema_type(SchemaType::from_iter([Type::Number, Type::Null]))
        .exclusive_minimum(Some(near_limit::MIN_EXCLUSIVE))
        .maximum(Some(near_limit::MAX))
        .description(Some(format!(
            "The share of each limit's quota from which an allowed acquire counts as near the \
             limit (`ratelimiter_near_limit_total{{policy, limit}}`): when it leaves at most \
             (1 - ratio) × quota remaining. Greater than {} and at most {}, compared to six \
             decimal places; {} (as Envoy's rate-limit service) when left out. Rate policies \
             only (422 for a concurrency policy).",
            near_limit::MIN_EXCLUSIVE,
            near_limit::MAX,
            near_limit::DEFAULT
        )))
        .examples([serde_json::json!(0.9)])
}

/// `request_limits` of a policy of one limit of `algorithm`: whether an Envoy descriptor's own
/// `limit` is honoured, and the most it may give (within the bounds of the algorithm's quota
/// field). Named `FixedWindowRequestLimits` and so on, added to `components`; `null` stands for
/// "left out".
fn request_limits(algorithm: Algorithm, components: &mut Components) -> OneOfBuilder {
    let quota = algorithm
        .fields()
        .iter()
        .find(|f| f.name == algorithm.quota_field())
        .map_or(MAX_UNITS, |f| f.max);
    let units: Vec<Value> = Unit::ALL.iter().map(|u| Value::from(u.as_str())).collect();
    let schema = ObjectBuilder::new()
        .schema_type(SchemaType::new(Type::Object))
        .description(Some(
            "Lets an Envoy descriptor's own `limit` (`RateLimitOverride { requests_per_unit, \
             unit }`) replace this policy's limit for that request, within this maximum; left \
             out, a descriptor's `limit` is ignored. Only for a policy of one limit (422 for \
             several, or a concurrency policy). `requests_per_unit` per `unit` becomes a window \
             of the unit admitting them (`fixed_window`, the sliding windows), a bucket of them \
             refilled over the unit (`token_bucket`: `capacity` = `refill_tokens`), or `rate` = \
             `burst` per `period_ms` of the unit (`gcra`). A request looser than the maximum in \
             rate (units per second) or in quota (units at once) is clamped in its own unit to \
             the most within both, or to the maximum itself when no whole unit fits. An \
             override of the subject wins over the request's limit.",
        ))
        .property(
            "max_requests_per_unit",
            ObjectBuilder::new()
                .schema_type(SchemaType::new(Type::Integer))
                .minimum(Some(1))
                .maximum(Some(quota))
                .description(Some(
                    "The most requests per `unit` a request may give; within the bounds of the \
                     limit's quota field (10000 for `sliding_window_log`)",
                )),
        )
        .required("max_requests_per_unit")
        .property(
            "unit",
            ObjectBuilder::new()
                .schema_type(SchemaType::new(Type::String))
                .enum_values(Some(units))
                .description(Some("The unit of the maximum; `month` is 30 days")),
        )
        .required("unit")
        .additional_properties(Some(AdditionalProperties::FreeForm(false)))
        .examples([serde_json::json!({"max_requests_per_unit": 1000, "unit": "minute"})]);
    let name = format!("{}RequestLimits", pascal(algorithm.as_str()));
    add(components, name.clone(), schema.build());
    reference_or_null(&name, None)
}

/// Changes of a rate policy's limits (a tier, or an override's `limits`): per limit, by name, the
/// fields whose values replace the limit's own. `LimitChanges`, of `LimitFieldChanges`, added to
/// `components`.
fn limit_changes(components: &mut Components) -> RefOr<Schema> {
    let fields = ObjectBuilder::new()
        .schema_type(SchemaType::new(Type::Object))
        .description(Some(
            "The fields of one limit to change, each within the field's own bounds and of the \
                 limit's algorithm (`algorithm` itself cannot change), and for a calendar limit \
                 its `time_zone`",
        ))
        .property(
            crate::policy::tiers::TIME_ZONE,
            ObjectBuilder::new()
                .schema_type(SchemaType::new(Type::String))
                .description(Some(
                    "Only for a calendar limit: the IANA time zone its periods are counted in \
                     instead of its `calendar.time_zone` (unit and anchors kept), so that a \
                     subject's day starts at its own midnight. Unknown zones and limits without \
                     a calendar are refused (422). When a subject's zone changes, its count \
                     carries until the end of the period it was counted in; the periods after \
                     that are the new zone's.",
                ))
                .examples([serde_json::json!("Asia/Tokyo")]),
        )
        .additional_properties(Some(AdditionalProperties::RefOr(RefOr::T(Schema::Object(
            ObjectBuilder::new()
                .schema_type(SchemaType::new(Type::Integer))
                .minimum(Some(1))
                .build(),
        )))))
        .examples([
            serde_json::json!({"limit": 1000}),
            serde_json::json!({"time_zone": "Asia/Tokyo"}),
        ]);
    add(components, "LimitFieldChanges".to_owned(), fields.build());
    let changes = ObjectBuilder::new()
        .schema_type(SchemaType::new(Type::Object))
        .description(Some(
            "Per limit of the policy, by its name (a policy of one limit: the policy's name), \
                 the fields whose values replace the limit's own",
        ))
        .additional_properties(Some(AdditionalProperties::RefOr(reference(
            "LimitFieldChanges",
        ))))
        .examples([serde_json::json!({"api-per-user": {"limit": 1000}})]);
    add(components, "LimitChanges".to_owned(), changes.build());
    reference("LimitChanges")
}

/// `tiers`: named changes of a rate policy's limits, which overrides give subjects; `Tiers`,
/// added to `components`, or `null`.
fn tiers(components: &mut Components) -> OneOfBuilder {
    let tier = limit_changes(components);
    let schema = ObjectBuilder::new()
        .schema_type(SchemaType::new(Type::Object))
        .description(Some(format!(
            "At most {MAX_TIERS} tiers, by name (`{NAME_PATTERN}`): each replaces some fields of \
                 some limits, for the subjects an override gives it (`POST \
                 /v1/policies/{{name}}/overrides` with `tier`). Replacement, not minimum: a tier may \
                 raise a limit as well as lower it. The subject's counters are kept."
        )))
        .additional_properties(Some(AdditionalProperties::RefOr(tier)))
        .examples([serde_json::json!({"pro": {"api-per-user": {"limit": 1000}}})]);
    add(components, "Tiers".to_owned(), schema.build());
    reference_or_null("Tiers", None)
}

/// `descriptor`: the Envoy rate-limit descriptors a rate policy serves over gRPC; `Descriptor`
/// (of `DescriptorEntry`), added to `components`, or `null`.
fn descriptor(components: &mut Components) -> OneOfBuilder {
    let text = |description: &str| {
        ObjectBuilder::new()
            .schema_type(SchemaType::new(Type::String))
            .min_length(Some(1))
            .max_length(Some(MAX_DESCRIPTOR_TEXT))
            // No control characters (Unicode's Cc, as `char::is_control`).
            .pattern(Some("^[^\\u0000-\\u001F\\u007F-\\u009F]+$"))
            .description(Some(format!(
                "{description}; at most {MAX_DESCRIPTOR_TEXT} bytes of UTF-8, no control \
                 characters"
            )))
    };
    let entry = ObjectBuilder::new()
        .schema_type(SchemaType::new(Type::Object))
        .description(Some("One entry of an Envoy rate-limit descriptor: its key, and perhaps a fixed value"))
        .property(
            "key",
            text("The descriptor entry's key, as Envoy's rate-limit action sets it (`remote_address`, a `descriptor_key`, `generic_key`…)"),
        )
        .required("key")
        .property(
            "value",
            text("A fixed value: the policy serves only descriptors whose entry has this value (e.g. `path` = `/login`). Left out, any value matches, and the value is part of the subject key"),
        )
        .additional_properties(Some(AdditionalProperties::FreeForm(false)));
    add(components, "DescriptorEntry".to_owned(), entry.build());
    let schema = ObjectBuilder::new()
        .schema_type(SchemaType::new(Type::Object))
        .description(Some(format!(
            "The Envoy rate-limit descriptors \
             this policy decides when the service serves Envoy's rate-limit protocol \
             (`grpc.bind`): those of `domain` whose entry keys are `entries`' keys, in order, \
             with each fixed `value` where one is given. When several policies match, the one \
             with a fixed value at the first entry where they differ wins; two policies may not \
             serve the same keys and fixed values in one domain (409, `descriptor-claimed`). \
             The subject key is the value of the one entry without a fixed value; with several, \
             their values in order, each with `\\` and `|` escaped by `\\`, joined by `|`; \
             with none, the fixed values the same way; over {MAX_KEY_BYTES} bytes, `sha256:` \
             and its hex digest. `POST /v1/acquire` with that key decides the same subject."
        )))
        .property(
            "domain",
            text("Envoy's rate-limit `domain` (the filter's `domain` setting)"),
        )
        .required("domain")
        .property(
            "entries",
            ArrayBuilder::new()
                .items(reference("DescriptorEntry"))
                .min_items(Some(1))
                .max_items(Some(MAX_ENTRIES)),
        )
        .required("entries")
        .additional_properties(Some(AdditionalProperties::FreeForm(false)));
    add(components, "Descriptor".to_owned(), schema.build());
    reference_or_null("Descriptor", None)
}

/// The schema names of a policy document's forms: `FixedWindowPolicy` … `GcraPolicy`,
/// `ConcurrencyPolicy`, `SeveralLimitsPolicy`, each with `Replacement` after it for a `PUT`
/// body.
fn policy_schema_name(form: &str, name_is: NameIs) -> String {
    match name_is {
        NameIs::Required => format!("{}Policy", pascal(form)),
        NameIs::Optional => format!("{}PolicyReplacement", pascal(form)),
    }
}

/// A policy document; see the module's documentation. The choice of its forms, each a named
/// schema added to `components` with every object it holds.
fn policy(name_is: NameIs, components: &mut Components) -> RefOr<Schema> {
    let may_leave_out_name = match name_is {
        NameIs::Required => "",
        NameIs::Optional => " `name` may be left out: the path gives it.",
    };
    let mut one_of = OneOfBuilder::new().description(Some(format!(
        "A rate-limit policy: one limit in the flat form (`algorithm` and its fields beside \
         `name`), or one to {MAX_LIMITS} limits of any algorithms in `limits`, decided together: \
         an acquire is allowed only if every limit admits it, and then every limit takes it. \
         A policy of one limit always reads back in the flat form. Or a concurrency policy \
         (`\"algorithm\": \"concurrency\"`, flat form only, never one of `limits`): at most \
         `limit` units held at once by leases (`POST /v1/leases`) that expire after `lease_ms` \
         unless renewed.{may_leave_out_name}"
    )));
    for form in Form::all() {
        // `request_limits` only in the flat form: a policy of one limit.
        let request_limits = request_limits(form.algorithm, components);
        let extra = rate_policy_object(
            format!(
                "A policy of one {} limit, in the flat form.{may_leave_out_name}",
                form.words()
            ),
            name_is,
            components,
        )
        .property("request_limits", request_limits);
        let o = limit_object(form, extra, components);
        let variant = policy_schema_name(&form.name(), name_is);
        one_of = one_of.item(reference(&variant));
        add(components, variant, o.build());
    }
    let concurrency_policy = kind_object(
        concurrency::NAME,
        &concurrency::FIELDS,
        policy_object(
            format!(
                "A concurrency policy: at most `limit` units held at once by leases.\
                 {may_leave_out_name}"
            ),
            name_is,
            components,
        ),
    )
    .property("mode", concurrency_mode())
    .property(
        concurrency::MAX_LEASE.name,
        ObjectBuilder::new()
            .schema_type(Type::Integer)
            .minimum(Some(concurrency::MAX_LEASE.min))
            .maximum(Some(concurrency::MAX_LEASE.max))
            .description(Some(format!(
                "{} ({} to {})",
                concurrency::MAX_LEASE.doc,
                concurrency::MAX_LEASE.min,
                concurrency::MAX_LEASE.max
            )))
            .examples([concurrency::MAX_LEASE.example]),
    );
    let variant = policy_schema_name(concurrency::NAME, name_is);
    one_of = one_of.item(reference(&variant));
    add(components, variant, concurrency_policy.build());
    // One limit may go unnamed (it takes the policy's name); several must each have a name,
    // distinct from the others' (which JSON Schema cannot state: the server answers 422).
    let limits = OneOfBuilder::new()
        .item(
            ArrayBuilder::new()
                .title(Some("one limit"))
                .items(limit(NameIs::Optional, components))
                .min_items(Some(1))
                .max_items(Some(1)),
        )
        .item(
            ArrayBuilder::new()
                .title(Some("several limits"))
                .description(Some("Each limit named, no two alike"))
                .items(limit(NameIs::Required, components))
                .min_items(Some(2))
                .max_items(Some(MAX_LIMITS)),
        );
    let several = rate_policy_object(
        format!(
            "A policy of one to {MAX_LIMITS} limits in `limits`, decided together.\
             {may_leave_out_name}"
        ),
        name_is,
        components,
    )
    .property("limits", limits)
    .required("limits")
    .additional_properties(Some(AdditionalProperties::FreeForm(false)));
    let variant = policy_schema_name("several_limits", name_is);
    one_of = one_of.item(reference(&variant));
    add(components, variant, several.build());
    one_of.into()
}

impl PartialSchema for PolicyDoc {
    fn schema() -> RefOr<Schema> {
        policy(NameIs::Required, &mut Vec::new())
    }
}

impl ToSchema for PolicyDoc {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("PolicyDoc")
    }

    fn schemas(schemas: &mut Components) {
        policy(NameIs::Required, schemas);
    }
}

/// The body of `PUT /v1/policies/{name}`: a [`PolicyDoc`] whose `name` may be left out. A type
/// for the spec only; the handler reads the body with [`crate::policy::parse_policy`].
pub struct PolicyReplacement;

impl PartialSchema for PolicyReplacement {
    fn schema() -> RefOr<Schema> {
        policy(NameIs::Optional, &mut Vec::new())
    }
}

impl ToSchema for PolicyReplacement {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("PolicyReplacement")
    }

    fn schemas(schemas: &mut Components) {
        policy(NameIs::Optional, schemas);
    }
}

/// An acquire's `policy`: a policy name.
pub fn policy_field() -> Object {
    name("Name of an existing policy", false).build()
}

/// An acquire's `cost`: at least 1, and never above the largest quota any algorithm allows
/// (the policy's own quota is checked by the server: 422 above it).
pub fn cost_field() -> Object {
    let largest = Algorithm::ALL
        .iter()
        .flat_map(|a| a.fields().iter().filter(|f| f.name == a.quota_field()))
        .map(|f| f.max)
        .max()
        .unwrap_or(1);
    ObjectBuilder::new()
        .schema_type(SchemaType::from_iter([Type::Integer, Type::Null]))
        .minimum(Some(1))
        .maximum(Some(largest))
        .description(Some(
            "Units to take, all or nothing: at least 1 and at most the quota of every limit of \
             the policy (its `limit`, `capacity` or `burst`); 422 above it. 1 when left out.",
        ))
        .examples([1])
        .build()
}

/// An acquire's `max_wait_ms`: 0 to [`LONGEST_WAIT_MS`], 0 when left out.
pub fn max_wait_field() -> Object {
    ObjectBuilder::new()
        .schema_type(SchemaType::from_iter([Type::Integer, Type::Null]))
        .minimum(Some(0))
        .maximum(Some(LONGEST_WAIT_MS))
        .description(Some(
            "Acquire only: the longest wait accepted, in milliseconds (at most 3600000, an hour; \
             422 above it, or on a peek). When `cost` fits only later but within this wait, it is \
             booked for that time and the answer is allowed with `delay_ms` and `act_at`. 0 when \
             left out: no wait, an ordinary acquire.",
        ))
        .examples([2000])
        .build()
}

/// A lease's `cost`: units it holds, 1 to the policy's `limit` (at most [`MAX_LIMIT`]), 1 when
/// left out.
pub fn lease_cost_field() -> Object {
    ObjectBuilder::new()
        .schema_type(SchemaType::from_iter([Type::Integer, Type::Null]))
        .minimum(Some(1))
        .maximum(Some(MAX_LIMIT))
        .description(Some(
            "Units the lease holds: at least 1 and at most the policy's `limit`; 422 above it. 1 \
             when left out.",
        ))
        .examples([1])
        .build()
}

/// A lease's `lease_ms`: 1 to [`MAX_LEASE_MS`], the policy's when left out.
pub fn lease_ms_field() -> Object {
    ObjectBuilder::new()
        .schema_type(SchemaType::from_iter([Type::Integer, Type::Null]))
        .minimum(Some(1))
        .maximum(Some(MAX_LEASE_MS))
        .description(Some(format!(
            "The lease's lifetime from now, in milliseconds: 1 to {MAX_LEASE_MS} (one day; \
             renew for longer). The policy's `lease_ms` when left out."
        )))
        .examples([30_000])
        .build()
}

/// A lease id, as issued: in a body, or in a path.
pub fn lease_id_field() -> Object {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .pattern(Some(LEASE_ID_PATTERN))
        .max_length(Some(MAX_LEASE_ID_BYTES))
        .description(Some(
            "An opaque lease id, as `POST /v1/leases` issued it (and its `Location` header \
             names it); it names the policy, the subject and the lease, and holds no `/`",
        ))
        .examples(["l1~exports~Y3VzdG9tZXItNw~4f3c2a9d8e7b6a5f4e3d2c1b0a998877~1"])
        .build()
}

/// A report's `cost`: units used, 1 to [`MAX_UNITS`], required.
pub fn report_cost_field() -> Object {
    ObjectBuilder::new()
        .schema_type(SchemaType::new(Type::Integer))
        .minimum(Some(1))
        .maximum(Some(MAX_UNITS))
        .description(Some(
            "Units used, taken whether or not they fit: at least 1 and at most 10^9, and may \
             exceed the policy's quota. A subject's usage is bounded at twice its quota; units \
             past that are not recorded.",
        ))
        .examples([1800])
        .build()
}

/// A refund's `cost`: units to give back, 1 to [`MAX_UNITS`], required.
pub fn refund_cost_field() -> Object {
    ObjectBuilder::new()
        .schema_type(SchemaType::new(Type::Integer))
        .minimum(Some(1))
        .maximum(Some(MAX_UNITS))
        .description(Some(
            "Units to give back: at least 1 and at most 10^9. Fewer are given back when the \
             subject has fewer in use, or the ticket took fewer or has expired.",
        ))
        .examples([700])
        .build()
}

/// `If-Match` as [`crate::api::policies`] reads it: `*`, or one quoted opaque ETag (RFC 9110
/// `etagc`, ASCII, no `,`). Two alternatives rather than one pattern, so that Schemathesis's
/// coverage phase, which cannot draw a header from a pattern, still finds `*`.
fn if_match() -> AnyOfBuilder {
    AnyOfBuilder::new()
        .item(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .enum_values(Some(["*"])),
        )
        .item(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .pattern(Some("^\"[!#-+\\--~]+\"$"))
                .examples(["\"8c3f0a51d2e94b7a.42\""]),
        )
}

fn header(name: &str, description: &str, schema: impl Into<RefOr<Schema>>) -> Parameter {
    ParameterBuilder::new()
        .name(name)
        .parameter_in(ParameterIn::Header)
        .required(Required::False)
        .description(Some(description))
        .schema(Some(schema))
        .build()
}

/// `If-None-Match`: only `*` (create only if absent).
fn if_none_match() -> ObjectBuilder {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .enum_values(Some(["*"]))
}

/// `{name}` of `/v1/policies/{name}`, as the handlers take it.
impl IntoParams for PolicyPath {
    fn into_params(_: impl Fn() -> Option<ParameterIn>) -> Vec<Parameter> {
        vec![ParameterBuilder::new()
            .name("name")
            .parameter_in(ParameterIn::Path)
            .required(Required::True)
            .description(Some("The policy's name"))
            .schema(Some(name("A policy name", false)))
            .build()]
    }
}

/// `{id}` of `/v1/leases/{id}`, as the handlers take it.
impl IntoParams for LeasePath {
    fn into_params(_: impl Fn() -> Option<ParameterIn>) -> Vec<Parameter> {
        vec![ParameterBuilder::new()
            .name("id")
            .parameter_in(ParameterIn::Path)
            .required(Required::True)
            .description(Some("The lease's id, as `POST /v1/leases` issued it"))
            .schema(Some(lease_id_field()))
            .build()]
    }
}

/// The preconditions of `PUT /v1/policies/{name}`.
pub struct ReplaceHeaders;

impl IntoParams for ReplaceHeaders {
    fn into_params(_: impl Fn() -> Option<ParameterIn>) -> Vec<Parameter> {
        vec![
            header(
                "If-Match",
                "Write only if the policy is at this version: its `ETag`, quoted as the header \
                 shows it, or `*` for any version. With `If-None-Match: *` as well, the two never both \
                 hold: 412",
                if_match(),
            ),
            header(
                "If-None-Match",
                "`*`: write only if the policy does not exist",
                if_none_match(),
            ),
        ]
    }
}

/// The precondition of `DELETE /v1/policies/{name}`.
pub struct DeleteHeaders;

impl IntoParams for DeleteHeaders {
    fn into_params(_: impl Fn() -> Option<ParameterIn>) -> Vec<Parameter> {
        vec![header(
            "If-Match",
            "Delete only if the policy is at this version: its `ETag`, quoted as the header shows \
             it, or `*` for any version",
            if_match(),
        )]
    }
}

/// `{"type": "null"}`: a field that may be given only as `null` (left out, as the parser reads it).
fn null_only() -> ObjectBuilder {
    ObjectBuilder::new().schema_type(Type::Null)
}

/// An override's `match`: exactly one of `key`, `prefix` or `cidr` (the others left out or
/// `null`).
fn override_match(components: &mut Components) -> RefOr<Schema> {
    const MEMBERS: [&str; 3] = ["key", "prefix", "cidr"];
    let member = |name: &str, description: &str, example: &str, max: Option<usize>| {
        let mut text = ObjectBuilder::new()
            .schema_type(Type::String)
            .min_length(Some(1))
            .description(Some(description));
        if let Some(max) = max {
            text = text.max_length(Some(max));
        }
        let mut o = ObjectBuilder::new()
            .schema_type(Type::Object)
            .property(name, text.examples([example]));
        for other in MEMBERS.into_iter().filter(|m| *m != name) {
            o = o.property(other, null_only());
        }
        o.required(name)
            .additional_properties(Some(AdditionalProperties::FreeForm(false)))
    };
    let members = [
        (
            "KeyMatch",
            member(
                "key",
                "That subject exactly (at most 256 bytes)",
                "acme-corp",
                Some(MAX_KEY_BYTES),
            ),
        ),
        (
            "PrefixMatch",
            member(
                "prefix",
                "Every subject key starting with these bytes (at most 256)",
                "acme-",
                Some(MAX_KEY_BYTES),
            ),
        ),
        (
            "CidrMatch",
            member(
                "cidr",
                "Every subject key that is an IPv4 or IPv6 address inside this range, written \
                 without host bits (an IPv4-mapped IPv6 address counts as IPv4)",
                "203.0.113.0/24",
                None,
            ),
        ),
    ];
    let mut one_of = OneOfBuilder::new().description(Some(
        "What the override applies to. Precedence when several match one subject: an exact \
         `key`, then the narrowest `cidr`, then the longest `prefix`. Two overrides of one \
         policy never have the same match (409 naming `match`).",
    ));
    for (name, member) in members {
        one_of = one_of.item(reference(name));
        add(components, name.to_owned(), member.build());
    }
    add(
        components,
        "OverrideMatch".to_owned(),
        Schema::OneOf(one_of.build()),
    );
    reference("OverrideMatch")
}

/// What an override sets: exactly one of these, given and not `null`.
const OVERRIDE_SETS: [&str; 4] = ["tier", "limits", "unlimited", "block"];

/// An override document: what `POST` and `PUT` take (`answer`: false) and every answer holds
/// (`answer`: true, with `id` and `created_at` required). One object per thing it sets (`tier`,
/// `limits`, `unlimited`, `block`), in which the other three may only be left out or `null`, so
/// that the schema says "exactly one" as the parser does.
fn override_doc(answer: bool, components: &mut Components) -> OneOfBuilder {
    use crate::policy::overrides::MAX_REASON_BYTES;
    let text = |description: &str| {
        ObjectBuilder::new()
            .schema_type(nullable_string())
            .description(Some(description))
    };
    let flag = |description: &str| {
        ObjectBuilder::new()
            .schema_type(Type::Boolean)
            .enum_values(Some([true]))
            .description(Some(description))
    };
    let date_time = || {
        Some(utoipa::openapi::SchemaFormat::KnownFormat(
            utoipa::openapi::KnownFormat::DateTime,
        ))
    };
    let sets = |name: &str, components: &mut Components| -> RefOr<Schema> {
        match name {
            "tier" => ObjectBuilder::new()
                .schema_type(Type::String)
                .description(Some("One of the policy's `tiers`, by name"))
                .pattern(Some(NAME_PATTERN))
                .into(),
            // Per limit of the policy, by name, the fields whose values replace the limit's own
            // (as a tier's).
            "limits" => limit_changes(components),
            "unlimited" => {
                flag("`true`: allowed without consulting the store (`decided_by: override`)").into()
            }
            _ => {
                flag("`true`: denied without consulting the store (`decided_by: override`)").into()
            }
        }
    };
    let (suffix, description) = if answer {
        ("Override", "An override, as the service answers it")
    } else {
        (
            "OverrideBody",
            "An override, as `POST` and `PUT` take it (`id` and `created_at` may be left out)",
        )
    };
    let mut doc = OneOfBuilder::new().description(Some(
        "An override of a policy for the subjects its `match` selects. It sets exactly one of \
         `tier`, `limits`, `unlimited` or `block` (the others left out, or `null`).",
    ));
    for set in OVERRIDE_SETS {
        let matches = override_match(components);
        let mut o = ObjectBuilder::new()
            .schema_type(Type::Object)
            .description(Some(format!("{description}, setting `{set}`")))
            .property(
                "id",
                text("Chosen by the service (16 hex digits); a `PUT` body may repeat the path's")
                    .pattern(Some("^[0-9a-f]{16}$")),
            )
            .property("match", matches);
        for other in OVERRIDE_SETS {
            o = if other == set {
                o.property(other, sets(other, components))
            } else {
                o.property(other, null_only())
            };
        }
        o = o
            .property(
                "expires_at",
                text(
                    "RFC 3339, in the future, at most a year ahead: after it the subject falls \
                     back to the next override by precedence, or to the policy",
                )
                .format(date_time())
                .examples(["2027-01-31T00:00:00Z"]),
            )
            .property(
                "reason",
                text(&format!(
                    "Free text for audit, at most {MAX_REASON_BYTES} bytes"
                ))
                .max_length(Some(MAX_REASON_BYTES)),
            )
            .property(
                "created_at",
                if answer {
                    text("When it was created (RFC 3339, UTC)").format(date_time())
                } else {
                    // Any text: what a read answered is accepted back, and ignored.
                    text("When it was created, as a read answers it; ignored")
                },
            )
            .required("match")
            .required(set)
            .additional_properties(Some(AdditionalProperties::FreeForm(false)));
        if answer {
            o = o.required("id").required("created_at");
        }
        let variant = format!("{}{suffix}", pascal(set));
        doc = doc.item(reference(&variant));
        add(components, variant, o.build());
    }
    doc
}

/// The body of `POST` and `PUT /v1/policies/{name}/overrides[/{id}]`.
pub struct OverrideBody;

impl PartialSchema for OverrideBody {
    fn schema() -> RefOr<Schema> {
        RefOr::T(Schema::OneOf(
            override_doc(false, &mut Vec::new())
                .examples([serde_json::json!({"match": {"key": "acme-corp"}, "tier": "pro", "reason": "enterprise plan"})])
                .build(),
        ))
    }
}

impl ToSchema for OverrideBody {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("OverrideBody")
    }

    fn schemas(schemas: &mut Components) {
        override_doc(false, schemas);
    }
}

/// An override as the API answers it.
pub struct OverrideAnswer;

impl PartialSchema for OverrideAnswer {
    fn schema() -> RefOr<Schema> {
        RefOr::T(Schema::OneOf(
            override_doc(true, &mut Vec::new())
                .examples([serde_json::json!({"id": "3f9b1e2d4a6870c1", "match": {"key": "acme-corp"}, "tier": "pro", "reason": "enterprise plan", "created_at": "2026-12-01T10:00:00Z"})])
                .build(),
        ))
    }
}

impl ToSchema for OverrideAnswer {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("Override")
    }

    fn schemas(schemas: &mut Components) {
        override_doc(true, schemas);
    }
}

/// `{name}` and `{id}` of `/v1/policies/{name}/overrides/{id}`.
impl IntoParams for super::overrides::OverridePath {
    fn into_params(_: impl Fn() -> Option<ParameterIn>) -> Vec<Parameter> {
        let mut params = PolicyPath::into_params(|| None);
        params.push(
            ParameterBuilder::new()
                .name("id")
                .parameter_in(ParameterIn::Path)
                .required(Required::True)
                .description(Some("The override's id, as its creation answered it"))
                .schema(Some(
                    ObjectBuilder::new()
                        .schema_type(Type::String)
                        .pattern(Some("^[0-9a-f]{16}$"))
                        .examples(["3f9b1e2d4a6870c1"]),
                ))
                .build(),
        );
        params
    }
}
