//! The OpenAPI schema of a policy document, built from the algorithms' own field descriptions
//! ([`crate::limiter::Field`]): one object per algorithm in the flat form and one in the `limits`
//! form, each with no properties but its own, so that the schema says exactly what
//! [`crate::policy::parse_policy`] accepts, from the same bounds.

use std::borrow::Cow;

use utoipa::openapi::schema::{
    AdditionalProperties, ArrayBuilder, ObjectBuilder, OneOfBuilder, Schema, Type,
};
use utoipa::openapi::RefOr;
use utoipa::{PartialSchema, ToSchema};

use crate::policy::{Algorithm, FailMode, PolicyDoc, MAX_DESCRIPTION_BYTES, MAX_LIMITS};

const NAME_PATTERN: &str = "^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$";

fn name(what: &str) -> ObjectBuilder {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .pattern(Some(NAME_PATTERN))
        .description(Some(format!("{what}: `{NAME_PATTERN}`")))
        .examples(["api-per-user"])
}

/// An object holding `algorithm` and its fields, plus `extra`; no other property.
fn limit_object(algorithm: Algorithm, extra: ObjectBuilder) -> ObjectBuilder {
    let mut o = extra
        .property(
            "algorithm",
            ObjectBuilder::new()
                .schema_type(Type::String)
                .enum_values(Some([algorithm.as_str()])),
        )
        .required("algorithm");
    for f in algorithm.fields() {
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

/// `name`, `description` and `fail_mode`, common to both forms.
fn policy_object(title: String) -> ObjectBuilder {
    let fail_mode = FailMode::schema();
    ObjectBuilder::new()
        .title(Some(title))
        .property("name", name("Unique policy name"))
        .required("name")
        .property(
            "description",
            ObjectBuilder::new()
                .schema_type(Type::String)
                .max_length(Some(MAX_DESCRIPTION_BYTES))
                .description(Some("Free text for operators, at most 1,024 bytes")),
        )
        .property("fail_mode", fail_mode)
}

impl PartialSchema for PolicyDoc {
    fn schema() -> RefOr<Schema> {
        let mut one_of = OneOfBuilder::new().description(Some(
            "A rate-limit policy: one limit in the flat form (`algorithm` and its fields beside \
             `name`), or one to eight limits of any algorithms in `limits`, decided together: an \
             acquire is allowed only if every limit admits it, and then every limit takes it. \
             A policy of one limit always reads back in the flat form.",
        ));
        for a in Algorithm::ALL {
            one_of = one_of.item(limit_object(
                a,
                policy_object(format!("{} policy", a.as_str())),
            ));
        }
        let mut limit = OneOfBuilder::new();
        for a in Algorithm::ALL {
            limit = limit.item(limit_object(
                a,
                ObjectBuilder::new()
                    .title(Some(format!("{} limit", a.as_str())))
                    .property(
                        "name",
                        name(
                            "The limit's name, unique within its policy; required when there \
                              are several",
                        ),
                    ),
            ));
        }
        let limits = policy_object("policy of several limits".to_owned())
            .property(
                "limits",
                ArrayBuilder::new()
                    .items(limit)
                    .min_items(Some(1))
                    .max_items(Some(MAX_LIMITS)),
            )
            .required("limits")
            .additional_properties(Some(AdditionalProperties::FreeForm(false)));
        one_of.item(limits).into()
    }
}

impl ToSchema for PolicyDoc {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("PolicyDoc")
    }
}
