//! The check that `docs/configuration.md` lists exactly the settings the code accepts.
//!
//! The settings are read from the code, not from a list kept by hand: [`Probe`] is a serde
//! `Deserializer` that, asked for a struct, hands it one field at a time and records the shape
//! of what that field asks for (a table and its fields, a number, a string, a choice and its
//! variants, an optional value, a list). Walking `RawSettings` with it yields every dotted key
//! the configuration accepts, whatever its default, optional or list settings included; a field
//! added to any settings struct appears here without anyone remembering to add it.
//!
//! Then, for every row of the reference's tables: the environment variable follows the
//! `RATELIMITER__SECTION__KEY` rule (or the setting is `(file only)`, when no environment value
//! can express it); the documented default, fed back as that variable, loads the very settings
//! the code defaults to (an `unset` / `none` default must be `None` or empty in the code); and
//! the documented bounds are the code's: each edge is accepted and each value just outside is
//! refused, naming the key. The TOML examples on the page must load as they are. The other
//! variables the service reads (`RATELIMITER_CONFIG`, `OTEL_*`), found as string literals in
//! `src/`, are each in the page's table of other variables, and that table names no variable
//! that `src/` never mentions.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::de::{self, value::Error as ProbeError, DeserializeSeed, IntoDeserializer, Visitor};
use serde::Deserialize;

use super::{is_list_key, RawSettings, Settings};

/// What one setting holds, as its type asks the deserializer for it.
#[derive(Debug, Clone, PartialEq)]
enum Shape {
    /// A struct: its field names.
    Table(&'static [&'static str]),
    /// An unsigned integer with its largest value.
    Unsigned(u64),
    Float,
    Bool,
    Text,
    /// One of these names.
    Choice(&'static [&'static str]),
    /// Whatever the document holds (the policies, validated by their own parser).
    Any,
    Optional(Box<Shape>),
    List(Box<Shape>),
}

/// A deserializer that walks `path` into nested structs, then records what the type at its end
/// asks for and refuses it (the refusal stops the deserialization, which is only a vehicle).
struct Probe<'a> {
    path: &'a [&'static str],
    found: &'a RefCell<Vec<Shape>>,
}

impl<'a> Probe<'a> {
    fn record<T>(self, shape: Shape) -> Result<T, ProbeError> {
        self.found.borrow_mut().push(shape);
        Err(de::Error::custom("probed"))
    }

    fn unsigned<T>(self, max: u64) -> Result<T, ProbeError> {
        if self.path.is_empty() {
            self.record(Shape::Unsigned(max))
        } else {
            Err(de::Error::custom("not a table"))
        }
    }
}

/// A map of one entry, `key` and the probe of its value.
struct OneField<'a> {
    key: Option<&'static str>,
    value: Probe<'a>,
}

impl<'de, 'a> de::MapAccess<'de> for OneField<'a> {
    type Error = ProbeError;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, ProbeError> {
        match self.key.take() {
            Some(key) => seed.deserialize(key.into_deserializer()).map(Some),
            None => Ok(None),
        }
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(
        &mut self,
        seed: V,
    ) -> Result<V::Value, ProbeError> {
        seed.deserialize(Probe {
            path: self.value.path,
            found: self.value.found,
        })
    }
}

/// A list of one element, the probe.
struct OneElement<'a>(Option<Probe<'a>>);

impl<'de, 'a> de::SeqAccess<'de> for OneElement<'a> {
    type Error = ProbeError;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, ProbeError> {
        match self.0.take() {
            Some(probe) => seed.deserialize(probe).map(Some),
            None => Ok(None),
        }
    }
}

macro_rules! leaf {
    ($($method:ident => $shape:expr),* $(,)?) => {
        $(fn $method<V: Visitor<'de>>(self, _: V) -> Result<V::Value, ProbeError> {
            if self.path.is_empty() {
                self.record($shape)
            } else {
                Err(de::Error::custom("not a table"))
            }
        })*
    };
}

impl<'de, 'a> de::Deserializer<'de> for Probe<'a> {
    type Error = ProbeError;

    leaf! {
        deserialize_any => Shape::Any,
        deserialize_bool => Shape::Bool,
        deserialize_f32 => Shape::Float,
        deserialize_f64 => Shape::Float,
        deserialize_str => Shape::Text,
        deserialize_string => Shape::Text,
        deserialize_char => Shape::Text,
        deserialize_i8 => Shape::Any,
        deserialize_i16 => Shape::Any,
        deserialize_i32 => Shape::Any,
        deserialize_i64 => Shape::Any,
        deserialize_bytes => Shape::Any,
        deserialize_byte_buf => Shape::Any,
        deserialize_unit => Shape::Any,
        deserialize_map => Shape::Any,
        deserialize_identifier => Shape::Text,
        deserialize_ignored_any => Shape::Any,
    }

    fn deserialize_u8<V: Visitor<'de>>(self, _: V) -> Result<V::Value, ProbeError> {
        self.unsigned(u8::MAX.into())
    }

    fn deserialize_u16<V: Visitor<'de>>(self, _: V) -> Result<V::Value, ProbeError> {
        self.unsigned(u16::MAX.into())
    }

    fn deserialize_u32<V: Visitor<'de>>(self, _: V) -> Result<V::Value, ProbeError> {
        self.unsigned(u32::MAX.into())
    }

    fn deserialize_u64<V: Visitor<'de>>(self, _: V) -> Result<V::Value, ProbeError> {
        self.unsigned(u64::MAX)
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, ProbeError> {
        let found = self.found;
        let result = visitor.visit_some(Probe {
            path: self.path,
            found,
        });
        if self.path.is_empty() {
            let mut found = found.borrow_mut();
            if let Some(inner) = found.pop() {
                found.push(Shape::Optional(Box::new(inner)));
            }
        }
        result
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, ProbeError> {
        if !self.path.is_empty() {
            return Err(de::Error::custom("not a table"));
        }
        let found = self.found;
        let result = visitor.visit_seq(OneElement(Some(Probe { path: &[], found })));
        let mut found = found.borrow_mut();
        let inner = found.pop().unwrap_or(Shape::Any);
        found.push(Shape::List(Box::new(inner)));
        result
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, ProbeError> {
        match self.path.split_first() {
            None => self.record(Shape::Table(fields)),
            Some((key, rest)) => visitor.visit_map(OneField {
                key: Some(key),
                value: Probe {
                    path: rest,
                    found: self.found,
                },
            }),
        }
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _: &'static str,
        variants: &'static [&'static str],
        _: V,
    ) -> Result<V::Value, ProbeError> {
        if self.path.is_empty() {
            self.record(Shape::Choice(variants))
        } else {
            Err(de::Error::custom("not a table"))
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        visitor: V,
    ) -> Result<V::Value, ProbeError> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        v: V,
    ) -> Result<V::Value, ProbeError> {
        self.deserialize_unit(v)
    }

    fn deserialize_tuple<V: Visitor<'de>>(self, _: usize, v: V) -> Result<V::Value, ProbeError> {
        self.deserialize_any(v)
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        _: usize,
        v: V,
    ) -> Result<V::Value, ProbeError> {
        self.deserialize_any(v)
    }

    fn deserialize_i128<V: Visitor<'de>>(self, v: V) -> Result<V::Value, ProbeError> {
        self.deserialize_any(v)
    }

    fn deserialize_u128<V: Visitor<'de>>(self, _: V) -> Result<V::Value, ProbeError> {
        self.unsigned(u64::MAX)
    }
}

/// The shape of what `T` holds at `path`.
fn shape_at<'de, T: Deserialize<'de>>(path: &[&'static str]) -> Shape {
    let found = RefCell::new(Vec::new());
    let _ = T::deserialize(Probe {
        path,
        found: &found,
    });
    let shape = found.borrow_mut().pop();
    shape.unwrap_or_else(|| panic!("the probe found nothing at {path:?}"))
}

/// Every setting the configuration accepts, by dotted key, with its shape: the leaves of the
/// tree of settings structs below `RawSettings`.
fn settings_in_the_code() -> BTreeMap<String, Shape> {
    fn walk(path: &mut Vec<&'static str>, out: &mut BTreeMap<String, Shape>) {
        match shape_at::<RawSettings>(path) {
            Shape::Table(fields) => {
                for field in fields {
                    path.push(field);
                    walk(path, out);
                    path.pop();
                }
            }
            // An optional section is walked like any other.
            Shape::Optional(inner) if matches!(*inner, Shape::Table(_)) => {
                if let Shape::Table(fields) = *inner {
                    for field in fields {
                        path.push(field);
                        walk(path, out);
                        path.pop();
                    }
                }
            }
            leaf => {
                out.insert(path.join("."), leaf);
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(&mut Vec::new(), &mut out);
    out
}

/// One row of a settings table on the page.
struct Row {
    line: usize,
    env: String,
    default: String,
    bounds: String,
}

fn page_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docs/configuration.md")
}

/// The cells of a table line, split on the pipes that are not escaped.
fn cells(line: &str) -> Vec<String> {
    let inner = line.trim().trim_start_matches('|').trim_end_matches('|');
    let mut out = vec![String::new()];
    let mut escaped = false;
    for c in inner.chars() {
        match c {
            '|' if !escaped => out.push(String::new()),
            _ => {
                escaped = c == '\\';
                if let Some(last) = out.last_mut() {
                    last.push(c);
                }
            }
        }
    }
    out.into_iter().map(|c| c.trim().to_owned()).collect()
}

/// The rows of every table on the page whose header names the columns `setting`,
/// `environment variable`, `default` and `bounds`, keyed by setting. A setting listed twice is
/// reported in `problems`.
fn settings_in_the_reference(page: &str, problems: &mut Vec<String>) -> BTreeMap<String, Row> {
    let mut rows = BTreeMap::new();
    let mut columns: Option<[usize; 4]> = None;
    for (i, line) in page.lines().enumerate() {
        let line_no = i + 1;
        if !line.trim_start().starts_with('|') {
            columns = None;
            continue;
        }
        let cells = cells(line);
        let at = |name: &str| cells.iter().position(|c| c.eq_ignore_ascii_case(name));
        if let (Some(s), Some(e), Some(d), Some(b)) = (
            at("setting"),
            at("environment variable"),
            at("default"),
            at("bounds"),
        ) {
            columns = Some([s, e, d, b]);
            continue;
        }
        let Some([s, e, d, b]) = columns else {
            continue;
        };
        if cells.iter().all(|c| c.chars().all(|ch| "-: ".contains(ch))) {
            continue;
        }
        let cell = |n: usize| cells.get(n).cloned().unwrap_or_default();
        let name = cell(s);
        let Some(key) = name.strip_prefix('`').and_then(|n| n.strip_suffix('`')) else {
            problems.push(format!(
                "docs/configuration.md:{line_no}: the setting cell `{name}` is not one `dotted.key`"
            ));
            continue;
        };
        let row = Row {
            line: line_no,
            env: cell(e),
            default: cell(d),
            bounds: cell(b),
        };
        if let Some(first) = rows.insert(key.to_owned(), row) {
            problems.push(format!(
                "docs/configuration.md:{line_no}: `{key}` is listed again (first on line {})",
                first.line
            ));
        }
    }
    rows
}

fn env_var(key: &str) -> String {
    format!("RATELIMITER__{}", key.to_uppercase().replace('.', "__"))
}

/// The text between backticks in `cell`, in order.
fn quoted(cell: &str) -> Vec<&str> {
    cell.split('`').skip(1).step_by(2).collect()
}

fn load(vars: &[(String, String)]) -> Result<Settings, String> {
    Settings::load_from(None, vars.to_vec()).map_err(|e| e.to_string())
}

/// The value the pretty `Debug` of `settings` shows for `key` (`section.field` or a top-level
/// field), as written there.
fn shown(settings: &str, key: &str) -> Option<String> {
    let (section, field) = match key.split_once('.') {
        Some((s, f)) => (Some(s), f),
        None => (None, key),
    };
    let mut lines = settings.lines();
    let indent = match section {
        Some(section) => {
            let head = format!("    {section}: ");
            lines.by_ref().find(|l| l.starts_with(&head))?;
            "        "
        }
        None => "    ",
    };
    let head = format!("{indent}{field}: ");
    lines
        .find(|l| l.starts_with(&head))
        .map(|l| l[head.len()..].trim_end_matches(',').to_owned())
}

/// Where a numeric setting's bounds cell allows values: `—` (none checked), or alternatives
/// joined by ` or `, each `` `a` ``, `` `a` to `b` ``, ``at least `a` `` or ``at most `b` ``
/// (words after the numbers, such as `(off)`, are comments).
fn intervals(cell: &str, max: f64) -> Result<Vec<(f64, f64)>, String> {
    if cell == "—" {
        return Ok(vec![(0.0, max)]);
    }
    let number = |text: &str| {
        text.parse::<f64>()
            .map_err(|_| format!("`{text}` is not a number"))
    };
    cell.split(" or ")
        .map(|alternative| {
            let alternative = alternative.trim();
            let numbers = quoted(alternative)
                .into_iter()
                .map(number)
                .collect::<Result<Vec<_>, _>>()?;
            match (numbers.as_slice(), alternative) {
                ([a], t) if t.starts_with("at least") => Ok((*a, max)),
                ([b], t) if t.starts_with("at most") => Ok((0.0, *b)),
                ([a], t) if t.starts_with('`') => Ok((*a, *a)),
                ([a, b], t) if t.starts_with('`') && t.contains(" to ") => Ok((*a, *b)),
                _ => Err(format!(
                    "cannot read the bounds `{alternative}` (write `a`, `a` to `b`, at least `a`, \
                     at most `b`, alternatives joined by \" or \", or — for none)"
                )),
            }
        })
        .collect()
}

/// The values at the edges of `intervals` (which must be accepted) and just outside them
/// (which must be refused), as the environment would spell them; the type's own smallest and
/// largest values are tried too, accepted or refused by where they fall.
fn edges(intervals: &[(f64, f64)], max: f64, float: bool) -> (Vec<String>, Vec<String>) {
    let step = if float { 0.001 } else { 1.0 };
    let inside = |v: f64| intervals.iter().any(|(lo, hi)| (*lo..=*hi).contains(&v));
    let spell = |v: f64| {
        if float {
            format!("{v}")
        } else if v >= max {
            // f64 cannot hold u64::MAX exactly: spell the type's largest value itself.
            format!("{}", max as u64)
        } else {
            format!("{}", v as u64)
        }
    };
    let mut tried: Vec<f64> = Vec::new();
    for (lo, hi) in intervals {
        tried.extend([*lo, *hi, lo - step, hi + step]);
    }
    if !float {
        tried.extend([0.0, max]);
    }
    let (mut accepted, mut refused) = (Vec::new(), Vec::new());
    for v in tried {
        if !float && !(0.0..=max).contains(&v) {
            continue;
        }
        let spelt = spell(v);
        let list = if inside(v) {
            &mut accepted
        } else {
            &mut refused
        };
        if !list.contains(&spelt) {
            list.push(spelt);
        }
    }
    (accepted, refused)
}

/// The problems with one setting's row, given its shape in the code.
fn check_row(key: &str, shape: &Shape, row: &Row, defaults: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let mut problem = |text: String| {
        problems.push(format!(
            "docs/configuration.md:{}: `{key}` {text}",
            row.line
        ))
    };
    let var = env_var(key);

    // The environment variable: the rule, or `(file only)` when no variable can express it.
    let (scalar, text_list) = match shape {
        Shape::Optional(inner) => (!matches!(**inner, Shape::Table(_) | Shape::Any), false),
        Shape::List(inner) => (false, **inner == Shape::Text),
        Shape::Table(_) | Shape::Any => (false, false),
        _ => (true, false),
    };
    if scalar || text_list {
        if quoted(&row.env).first() != Some(&var.as_str()) {
            problem(format!(
                "has the environment variable {}, not `{var}`",
                row.env
            ));
        }
        if text_list != is_list_key(key) {
            problem(if text_list {
                "is a list: `is_list_key` must name it, or its variable is not split".to_owned()
            } else {
                "is not a list, but `is_list_key` names it".to_owned()
            });
        }
        if text_list && !row.env.contains("comma-separated") {
            problem("is a list: its variable cell must say `(comma-separated)`".to_owned());
        }
    } else if row.env != "(file only)" {
        problem(format!(
            "cannot come from one environment variable (it is {shape:?}): write `(file only)`"
        ));
    }

    // The default.
    let code_default = shown(defaults, key);
    if matches!(shape, Shape::Optional(_) | Shape::List(_)) {
        let empty = matches!(code_default.as_deref(), Some("None" | "[]"));
        let said_empty = row.default.starts_with("unset") || row.default.starts_with("none");
        if !(empty && said_empty) {
            problem(format!(
                "defaults to {code_default:?} in the code; the page says {:?} (an empty default is \
                 written `unset…` or `none…`)",
                row.default
            ));
        }
    } else {
        match quoted(&row.default).as_slice() {
            [value] => {
                match load(&[(var.clone(), (*value).to_owned())]) {
                    Ok(s) if format!("{s:#?}") == defaults => {}
                    Ok(_) => problem(format!(
                        "defaults to {code_default:?} in the code, not `{value}` as the page says"
                    )),
                    Err(e) => problem(format!("refuses its documented default `{value}`: {e}")),
                };
            }
            _ => problem(format!(
                "needs its default as one `value` in the default cell, not {:?}",
                row.default
            )),
        }
    }

    // The bounds.
    match shape {
        Shape::Unsigned(max) => {
            let max = *max as f64;
            match intervals(&row.bounds, max) {
                Err(e) => problem(e),
                Ok(allowed) => {
                    let (accepted, refused) = edges(&allowed, max, false);
                    check_edges(key, &var, &accepted, &refused, &mut problem);
                }
            }
        }
        Shape::Float => match intervals(&row.bounds, f64::MAX) {
            Err(e) => problem(e),
            Ok(allowed) => {
                let (accepted, refused) = edges(&allowed, f64::MAX, true);
                check_edges(key, &var, &accepted, &refused, &mut problem);
            }
        },
        Shape::Choice(variants) => {
            let mut listed = quoted(&row.bounds);
            listed.sort_unstable();
            let mut variants = variants.to_vec();
            variants.sort_unstable();
            if listed != variants {
                problem(format!(
                    "is one of {variants:?} in the code; its bounds cell lists {listed:?}"
                ));
            }
        }
        Shape::Bool if row.bounds != "`true` or `false`" => {
            problem("is a boolean: its bounds cell is `true` or `false`".to_owned())
        }
        _ => {}
    }
    problems
}

fn check_edges(
    key: &str,
    var: &str,
    accepted: &[String],
    refused: &[String],
    problem: &mut impl FnMut(String),
) {
    for value in accepted {
        if let Err(e) = load(&[(var.to_owned(), value.clone())]) {
            problem(format!(
                "refuses `{value}`, inside its documented bounds: {e}"
            ));
        }
    }
    for value in refused {
        match load(&[(var.to_owned(), value.clone())]) {
            Ok(_) => problem(format!("accepts `{value}`, outside its documented bounds")),
            Err(e) if !e.contains(key) => {
                problem(format!("refuses `{value}` without naming the key: {e}"))
            }
            Err(_) => {}
        }
    }
}

#[test]
fn the_probe_sees_every_kind_of_setting() {
    let settings = settings_in_the_code();
    assert_eq!(settings["server.bind"], Shape::Text);
    assert_eq!(settings["server.workers"], Shape::Unsigned(u64::MAX));
    assert_eq!(
        settings["redis.pool_size"],
        Shape::Unsigned(u32::MAX.into())
    );
    assert_eq!(
        settings["grpc.bind"],
        Shape::Optional(Box::new(Shape::Text))
    );
    assert_eq!(
        settings["auth.admin_tokens"],
        Shape::List(Box::new(Shape::Text))
    );
    assert_eq!(settings["tracing.sample_ratio"], Shape::Float);
    assert_eq!(settings["limits.shadow"], Shape::Bool);
    assert!(matches!(settings["log.format"], Shape::Choice(_)));
    assert_eq!(settings["policies"], Shape::List(Box::new(Shape::Any)));
    // Filled by loading, not settable.
    assert!(!settings.contains_key("tracing.endpoint"));
    assert!(!settings.contains_key("server"));
}

#[test]
fn the_reference_lists_every_setting_and_only_those() {
    let path = page_path();
    let page = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let mut problems = Vec::new();
    let documented = settings_in_the_reference(&page, &mut problems);
    let code = settings_in_the_code();
    for key in code.keys().filter(|k| !documented.contains_key(*k)) {
        problems.push(format!(
            "`{key}` is a setting in src/config.rs but has no row in docs/configuration.md"
        ));
    }
    for (key, row) in documented.iter().filter(|(k, _)| !code.contains_key(*k)) {
        problems.push(format!(
            "docs/configuration.md:{}: `{key}` is not a setting of src/config.rs",
            row.line
        ));
    }
    let defaults = format!("{:#?}", load(&[]).expect("the defaults load"));
    for (key, shape) in &code {
        if let Some(row) = documented.get(key) {
            problems.extend(check_row(key, shape, row, &defaults));
        }
    }
    assert!(
        problems.is_empty(),
        "docs/configuration.md and src/config.rs disagree:\n  {}",
        problems.join("\n  ")
    );
}

#[test]
fn the_example_files_in_the_reference_load() {
    let path = page_path();
    let page = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let mut examples = Vec::new();
    let mut current: Option<(usize, String)> = None;
    for (i, line) in page.lines().enumerate() {
        match (&mut current, line.trim_end()) {
            (None, "```toml") => current = Some((i + 1, String::new())),
            (Some(_), "```") => examples.extend(current.take()),
            (Some((_, text)), line) => {
                text.push_str(line);
                text.push('\n');
            }
            (None, _) => {}
        }
    }
    assert!(
        !examples.is_empty(),
        "docs/configuration.md has no ```toml example"
    );
    for (n, (line, text)) in examples.iter().enumerate() {
        let file = std::env::temp_dir().join(format!(
            "ratelimiter-reference-{}-{n}.toml",
            std::process::id()
        ));
        std::fs::write(&file, text).expect("write the example");
        let loaded = Settings::load_from(Some(&file), Vec::new());
        let _ = std::fs::remove_file(&file);
        if let Err(e) = loaded {
            panic!("docs/configuration.md:{line}: the example does not load: {e}");
        }
    }
}

/// The text of every `src/**/*.rs`.
fn sources() -> Vec<String> {
    let mut out = Vec::new();
    let mut dirs = vec![PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src")];
    while let Some(dir) = dirs.pop() {
        let entries = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()));
        for path in entries.flatten().map(|e| e.path()) {
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(std::fs::read_to_string(&path).unwrap_or_default());
            }
        }
    }
    out
}

/// The string literals in `sources` that name an environment variable read outside the
/// settings: `"OTEL_…"` and `"RATELIMITER_…"` with one underscore.
fn other_variables_in(sources: &[String]) -> std::collections::BTreeSet<String> {
    let mut found = std::collections::BTreeSet::new();
    for source in sources {
        for start in ["\"OTEL_", "\"RATELIMITER_"] {
            for (at, _) in source.match_indices(start) {
                let name: String = source[at + 1..]
                    .chars()
                    .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                    .collect();
                let closed = source[at + 1 + name.len()..].starts_with('"');
                // A bare prefix (this scan's own needles) names no variable.
                if closed && !name.ends_with('_') && !name.starts_with("RATELIMITER__") {
                    found.insert(name);
                }
            }
        }
    }
    found
}

#[test]
fn the_reference_names_every_other_variable_the_service_reads() {
    let path = page_path();
    let page = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let mut listed = std::collections::BTreeSet::new();
    let mut in_table = false;
    for line in page.lines() {
        let cells = cells(line);
        if !line.trim_start().starts_with('|') {
            in_table = false;
        } else if cells.first().is_some_and(|c| c == "variable") {
            in_table = true;
        } else if in_table {
            if let Some(name) = quoted(&cells[0]).first() {
                listed.insert((*name).to_owned());
            }
        }
    }
    let sources = sources();
    let code = other_variables_in(&sources);
    let sources_mention = |name: &str| sources.iter().any(|s| s.contains(name));
    let mut problems: Vec<String> = code
        .difference(&listed)
        .map(|v| format!("`{v}` is read in src/ but not in the page's table of other variables"))
        .collect();
    problems.extend(listed.iter().filter(|v| !sources_mention(v)).map(|v| {
        format!("`{v}` is in the page's table of other variables but src/ never names it")
    }));
    assert!(
        code.contains("RATELIMITER_CONFIG"),
        "the scan found {code:?}"
    );
    assert!(
        problems.is_empty(),
        "docs/configuration.md:\n  {}",
        problems.join("\n  ")
    );
}
