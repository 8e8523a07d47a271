//! The decision logic of every algorithm, as pure functions.
//!
//! Each algorithm module implements [`Rule`] (its fields, its pure `decide`, its script's
//! parameters): no I/O, no clock reads, no allocation beyond the state it owns; [`decide_all`]
//! decides a policy's limits together. The embedded store runs these functions
//! directly; the Lua scripts in `lua/` implement the same arithmetic on Redis, and the property
//! tests hold the two to identical answers on the same inputs.
//!
//! Shared rules, which every algorithm follows and the Lua scripts copy:
//! - time is integer microseconds; a `now` earlier than the time stored in the state is treated
//!   as the stored time, so a clock step back never refunds quota or reopens a window;
//! - a denied request and a peek write nothing (the sliding log drops entries that have left
//!   the window only when it writes: a take, a report, a refund);
//! - callers guarantee `1 <= cost <= quota` of every limit for an acquire or a peek (the API
//!   rejects larger costs first); a report or a refund may name up to [`MAX_UNITS`];
//! - a subject's usage never passes twice its quota: a report records at most what brings it
//!   there ([`Rule::report`]), so debt is bounded by one quota and its repayment by the time to
//!   earn one quota back;
//! - a refund never creates state, never raises a subject above its full quota, and never
//!   moves an expiry; with a ticket's mark ([`Rule::refund`]) it gives back only units the
//!   ticket's take still holds;
//! - durations are measured from the caller's `now`, so a clock that stepped back gets waits that
//!   are long enough on its own clock;
//! - a state may be decided under other parameters of its algorithm than it was written under
//!   (a policy update, an override, a tier): the usage it records carries over (units spent
//!   and not yet earned back count against the new quota), the state drains or slides as it was
//!   written until a take or a report rewrites it under the new parameters, and a state whose
//!   expiry has passed answers exactly as no state, whatever the parameters (each module's "A
//!   change of parameters" says how; `carry_over.rs` tests it).

pub mod arith;
pub mod calendar;
#[cfg(test)]
mod carry_over;
pub mod concurrency;
pub mod fixed_window;
pub mod gcra;
pub mod reservation;
pub mod sliding_window_counter;
pub mod sliding_window_log;
pub mod token_bucket;

/// What each algorithm's module provides, implemented on its `Params`: everything the policy
/// model, the stores and the tests need to run it, so that nothing outside the module and the
/// registry below matches on the algorithm.
pub trait Rule: Copy {
    /// The algorithm's one name: JSON `algorithm`, `lua/<name>.lua`, state keys.
    const NAME: &'static str;
    /// The policy fields that set the parameters, in the order [`Rule::from_fields`] takes them.
    const FIELDS: &'static [Field];
    /// How many parameters its script part takes (`ARGV[a + 1]` to `ARGV[a + ARITY]`, see
    /// `lua/common.lua`): [`Rule::script_args`] gives exactly these.
    const ARITY: usize = Self::FIELDS.len();
    /// Which of [`Rule::FIELDS`] is the quota ([`Rule::quota`]): named when a cost exceeds it.
    const QUOTA_FIELD: &'static str;
    /// What is kept per subject.
    type State: std::fmt::Debug + Send;
    /// The parameters from the fields' values, in [`Rule::FIELDS`] order, each within its
    /// bounds.
    fn from_fields(values: &[u64]) -> Self;
    /// The fields' values, in [`Rule::FIELDS`] order, of a limit of `requests` units per
    /// `period_ms`, as Envoy's `RateLimitOverride { requests_per_unit, unit }` means one: a
    /// window of `period_ms` admitting `requests`, or a bucket of `requests` refilled over
    /// `period_ms`. The caller keeps both within the fields' bounds.
    fn per_period(requests: u64, period_ms: u64) -> ScriptArgs;
    /// The pure decision: whether `cost` units fit at `now_us`. When they fit and `take` is set
    /// they are taken (`state` and `ttl_us` say what to keep); otherwise nothing is taken and the
    /// decision describes the subject as it stands: `allowed` says whether the units fit,
    /// `retry_after_us` is 0 when they do, and `ttl_us` is `None`. Deciding with `take` unset and
    /// then again with `take` set on the state it returns gives the same answer as deciding with
    /// `take` set at once.
    fn decide(
        &self,
        state: Option<Self::State>,
        cost: u64,
        now_us: u64,
        take: bool,
    ) -> Outcome<Self::State>;
    /// Takes `cost` units whether or not they fit (a report of what was used): the subject may
    /// go into debt, its usage reaching at most twice its quota; units past that are not
    /// recorded. Returns the outcome and the units recorded. The decision is allowed and
    /// describes the subject afterwards, for one unit: `remaining` (0 while in debt),
    /// `reset_after_us`, and `retry_after_us`, the time until one unit is available again (0
    /// when `remaining` is at least 1). Units recorded make state with its expiry, as a take
    /// does; none recorded (a subject at its bound) change nothing.
    fn report(
        &self,
        state: Option<Self::State>,
        cost: u64,
        now_us: u64,
    ) -> (Outcome<Self::State>, u64);
    /// Gives back at most `units` units (a refund): never above the full quota, never to a
    /// subject without state (`state` `None` stays `None`), and never moving the expiry (the
    /// outcome's `ttl_us` is `None`). With `mark`, the [`Verdict::marks`] value of the take the
    /// units came from (`now_us + reset_after_us` of its decision), only units that take still
    /// holds are given back: those in the window it counted in, the log entry it made, or the
    /// part of its cost that time has not yet refilled and no refund since has moved up
    /// ([`undrained`]). Returns the outcome, whose decision
    /// describes the subject afterwards as [`Rule::report`]'s does, and the units given back.
    fn refund(
        &self,
        state: Option<Self::State>,
        units: u64,
        now_us: u64,
        mark: Option<Mark>,
    ) -> (Outcome<Self::State>, u64);
    /// The units refunds have given back to `state` since it began ([`Life`]), which a ticket
    /// keeps with its mark: kept by the algorithms whose marks every refund moves (token bucket,
    /// GCRA); 0 for the others.
    fn refunded(_state: &Self::State) -> u64 {
        0
    }
    /// The script's parameters (`ARGV[a + 1]` onwards, see `lua/common.lua`).
    fn script_args(&self) -> ScriptArgs;
    /// The most units one subject can be granted at once.
    fn quota(&self) -> u64;
    /// The time over which the quota is granted, for `RateLimit-Policy`'s `w`: the window, or the
    /// time to refill from empty, in µs.
    fn window_us(&self) -> u64;
}

/// One numeric field of an algorithm's parameters, as policy documents name it. Validation, its
/// error messages and the OpenAPI schema all read the bounds from here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Field {
    pub name: &'static str,
    pub min: u64,
    pub max: u64,
    /// What the field means, for the OpenAPI schema.
    pub doc: &'static str,
    /// A typical value, for the OpenAPI schema.
    pub example: u64,
}

/// Most parameters of one limit's script part ([`Rule::ARITY`]).
pub const MAX_ARITY: usize = 5;

/// A few integers without allocating: a script's parameters, or the values of a limit's fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ScriptArgs {
    args: [u64; MAX_ARITY],
    len: usize,
}

impl ScriptArgs {
    /// At most [`MAX_ARITY`] arguments.
    pub fn new(args: &[u64]) -> Self {
        let mut out = [0; MAX_ARITY];
        let len = args.len().min(MAX_ARITY);
        out[..len].copy_from_slice(&args[..len]);
        Self { args: out, len }
    }

    pub fn as_slice(&self) -> &[u64] {
        &self.args[..self.len]
    }
}

impl IntoIterator for ScriptArgs {
    type Item = u64;
    type IntoIter = std::iter::Take<std::array::IntoIter<u64, MAX_ARITY>>;

    fn into_iter(self) -> Self::IntoIter {
        self.args.into_iter().take(self.len)
    }
}

/// `Rule` for a window algorithm's `Params { limit, window_us, .. }` and its module's `decide`,
/// `report` and `refund`: the three window algorithms take the same fields. `$max_limit` bounds
/// `limit`. With `$arity`, the module's `Params::every(limit, window_us)` builds the parameters
/// and `Params::args` gives the script its `$arity` arguments (a fixed window's calendar
/// boundaries); without, the parameters are the two fields.
macro_rules! window_rule {
    ($name:literal, $max_limit:expr) => {
        super::window_rule!(@impl $name, $max_limit, 2,
            |limit, window_us| Params { limit, window_us },
            |p: &Params| super::ScriptArgs::new(&[p.limit, p.window_us]));
    };
    ($name:literal, $max_limit:expr, $arity:literal) => {
        super::window_rule!(@impl $name, $max_limit, $arity, Params::every, Params::args);
    };
    (@impl $name:literal, $max_limit:expr, $arity:literal, $new:expr, $args:expr) => {
        impl super::Rule for Params {
            const NAME: &'static str = $name;
            const FIELDS: &'static [super::Field] = &[
                super::Field {
                    name: "limit",
                    min: 1,
                    max: $max_limit,
                    doc: "units allowed per window",
                    example: 100,
                },
                super::Field {
                    name: "window_ms",
                    min: 1,
                    max: super::MAX_PERIOD_MS,
                    doc: "the window's length in milliseconds",
                    example: 60_000,
                },
            ];
            const ARITY: usize = $arity;
            const QUOTA_FIELD: &'static str = "limit";
            type State = State;

            fn per_period(requests: u64, period_ms: u64) -> super::ScriptArgs {
                super::ScriptArgs::new(&[requests, period_ms])
            }

            fn from_fields(values: &[u64]) -> Self {
                let [limit, window_ms] = super::fields::<2>(values);
                ($new)(limit, window_ms * 1_000)
            }

            fn decide(
                &self,
                state: Option<State>,
                cost: u64,
                now_us: u64,
                take: bool,
            ) -> Outcome<State> {
                decide(state, self, cost, now_us, take)
            }

            fn report(
                &self,
                state: Option<State>,
                cost: u64,
                now_us: u64,
            ) -> (Outcome<State>, u64) {
                report(state, self, cost, now_us)
            }

            fn refund(
                &self,
                state: Option<State>,
                units: u64,
                now_us: u64,
                mark: Option<super::Mark>,
            ) -> (Outcome<State>, u64) {
                refund(state, self, units, now_us, mark.map(|m| m.at))
            }

            fn script_args(&self) -> super::ScriptArgs {
                ($args)(self)
            }

            fn quota(&self) -> u64 {
                self.limit
            }

            fn window_us(&self) -> u64 {
                self.window_us
            }
        }
    };
}
pub(crate) use window_rule;

/// Largest `limit`, `capacity`, `refill_tokens`, `rate` and `burst`.
pub const MAX_UNITS: u64 = 1_000_000_000;
/// Longest `window_ms`, `refill_period_ms` and `period_ms`: 31 days.
pub const MAX_PERIOD_MS: u64 = 31 * 24 * 3_600 * 1_000;

/// The first `N` values, zeros for any missing (callers pass `FIELDS.len()` values).
pub(crate) fn fields<const N: usize>(values: &[u64]) -> [u64; N] {
    let mut out = [0; N];
    for (o, v) in out.iter_mut().zip(values) {
        *o = *v;
    }
    out
}

/// The registry: every algorithm, its module and the Lua helpers its script needs besides
/// `lua/common.lua` and its own `lua/<module>.lua`, named once. It generates [`Algorithm`],
/// [`Params`] and [`State`] and their dispatch.
macro_rules! algorithms {
    ($($variant:ident => $module:ident [$($helper:literal),*]),+ $(,)?) => {
        /// The algorithms, each with one name used everywhere: Rust module, Lua script, JSON
        /// value.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
        #[serde(rename_all = "snake_case")]
        pub enum Algorithm {
            $($variant),+
        }

        impl Algorithm {
            pub const ALL: [Algorithm; [$(Algorithm::$variant),+].len()] = [$(Algorithm::$variant),+];

            /// The algorithm's one name, as in JSON, in `lua/<name>.lua` and in state keys.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $(Algorithm::$variant => <$module::Params as Rule>::NAME),+
                }
            }

            pub fn parse(s: &str) -> Option<Self> {
                Self::ALL.into_iter().find(|a| a.as_str() == s)
            }

            /// The policy fields of its parameters.
            pub const fn fields(self) -> &'static [Field] {
                match self {
                    $(Algorithm::$variant => <$module::Params as Rule>::FIELDS),+
                }
            }

            /// The fields' values of a limit of `requests` units per `period_ms`
            /// ([`Rule::per_period`]).
            pub fn per_period(self, requests: u64, period_ms: u64) -> ScriptArgs {
                match self {
                    $(Algorithm::$variant => <$module::Params as Rule>::per_period(requests, period_ms)),+
                }
            }

            /// How many parameters its script part takes ([`Rule::ARITY`]).
            pub const fn arity(self) -> usize {
                match self {
                    $(Algorithm::$variant => <$module::Params as Rule>::ARITY),+
                }
            }

            /// The field that holds the quota.
            pub const fn quota_field(self) -> &'static str {
                match self {
                    $(Algorithm::$variant => <$module::Params as Rule>::QUOTA_FIELD),+
                }
            }

            /// Parameters from the values of [`Algorithm::fields`], each within its bounds.
            pub fn params(self, values: &[u64]) -> Params {
                match self {
                    $(Algorithm::$variant => Params::$variant(<$module::Params as Rule>::from_fields(values))),+
                }
            }

            /// `lua/<name>.lua`: the algorithm's part of a decision script (see
            /// `lua/common.lua` for how the parts are put together).
            pub const fn lua(self) -> &'static str {
                match self {
                    $(Algorithm::$variant => include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/lua/", stringify!($module), ".lua"))),+
                }
            }

            /// The helper files (`lua/<helper>`) its part uses, by name and content.
            pub const fn lua_helpers(self) -> &'static [(&'static str, &'static str)] {
                match self {
                    $(Algorithm::$variant => &[$(($helper, include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/lua/", $helper)))),*]),+
                }
            }
        }

        /// An algorithm with its validated parameters, as its decision function takes them.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum Params {
            $($variant($module::Params)),+
        }

        /// One subject's state, tagged by algorithm.
        #[derive(Debug, Clone)]
        pub enum State {
            $($variant(<$module::Params as Rule>::State)),+
        }

        impl State {
            /// The units refunds have given back to it since it began ([`Rule::refunded`]).
            pub fn refunded(&self) -> u64 {
                match self {
                    $(State::$variant(s) => <$module::Params as Rule>::refunded(s)),+
                }
            }
        }

        impl Params {
            pub const fn algorithm(&self) -> Algorithm {
                match self {
                    $(Params::$variant(_) => Algorithm::$variant),+
                }
            }

            /// The most units one subject can be granted at once: `limit`, `capacity` or
            /// `burst`.
            pub fn quota(&self) -> u64 {
                match self {
                    $(Params::$variant(p) => Rule::quota(p)),+
                }
            }

            /// The time over which the quota is granted, in µs ([`Rule::window_us`]).
            pub fn window_us(&self) -> u64 {
                match self {
                    $(Params::$variant(p) => Rule::window_us(p)),+
                }
            }

            /// The script's parameters.
            pub fn script_args(&self) -> ScriptArgs {
                match self {
                    $(Params::$variant(p) => Rule::script_args(p)),+
                }
            }

            /// Reports with the algorithm's pure function ([`Rule::report`]). State of another
            /// algorithm counts as none.
            pub fn report(&self, state: Option<State>, cost: u64, now_us: u64) -> (Outcome<State>, u64) {
                match self {
                    $(Params::$variant(p) => {
                        let state = match state {
                            Some(State::$variant(s)) => Some(s),
                            _ => None,
                        };
                        let (o, units) = Rule::report(p, state, cost, now_us);
                        (o.map_state(State::$variant), units)
                    }),+
                }
            }

            /// Refunds with the algorithm's pure function ([`Rule::refund`]). State of another
            /// algorithm counts as none.
            pub fn refund(&self, state: Option<State>, units: u64, now_us: u64, mark: Option<Mark>) -> (Outcome<State>, u64) {
                match self {
                    $(Params::$variant(p) => {
                        let state = match state {
                            Some(State::$variant(s)) => Some(s),
                            _ => None,
                        };
                        let (o, units) = Rule::refund(p, state, units, now_us, mark);
                        (o.map_state(State::$variant), units)
                    }),+
                }
            }

            /// Decides with the algorithm's pure function ([`Rule::decide`]). State of another
            /// algorithm counts as none.
            pub fn decide(&self, state: Option<State>, cost: u64, now_us: u64, take: bool) -> Outcome<State> {
                match self {
                    $(Params::$variant(p) => {
                        let state = match state {
                            Some(State::$variant(s)) => Some(s),
                            _ => None,
                        };
                        Rule::decide(p, state, cost, now_us, take).map_state(State::$variant)
                    }),+
                }
            }
        }
    };
}

algorithms! {
    FixedWindow => fixed_window [],
    SlidingWindowLog => sliding_window_log [],
    SlidingWindowCounter => sliding_window_counter ["muldiv.lua"],
    TokenBucket => token_bucket ["muldiv.lua"],
    Gcra => gcra ["muldiv.lua"],
}

/// The most limits one policy holds.
pub const MAX_LIMITS: usize = 8;

/// What a decision does to a subject's limits. Each is one atomic step over all of a policy's
/// limits, on every store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// Takes `cost` from every limit if every limit admits it; otherwise takes nothing.
    Acquire,
    /// Answers as `Acquire` would now, and writes nothing.
    Peek,
    /// Takes `cost` from every limit whether or not it fits ([`Rule::report`]).
    Report,
    /// Gives up to `cost` units back to every limit ([`Rule::refund`]).
    Refund,
}

impl Op {
    pub const ALL: [Op; 4] = [Op::Acquire, Op::Peek, Op::Report, Op::Refund];

    /// The operation's name, as in its endpoint `/v1/<name>` and in metrics.
    pub const fn as_str(self) -> &'static str {
        match self {
            Op::Acquire => "acquire",
            Op::Peek => "peek",
            Op::Report => "report",
            Op::Refund => "refund",
        }
    }

    /// Whether it may create state for a subject that has none.
    pub const fn creates_state(self) -> bool {
        matches!(self, Op::Acquire | Op::Report)
    }
}

/// Decides one acquire over all of a policy's limits at once: allowed only if every limit admits
/// `cost`, and then every limit takes it; if any denies, none takes anything. `states[i]` is
/// limit `i`'s state, replaced by what to keep, and `ttls[i]` is set as [`Outcome::ttl_us`].
/// The slices are as long as `params`, at most [`MAX_LIMITS`].
pub fn decide_all(
    params: &[Params],
    states: &mut [Option<State>],
    ttls: &mut [Option<u64>],
    cost: u64,
    now_us: u64,
) -> Verdict {
    decide_op(params, states, ttls, Op::Acquire, cost, now_us, &[])
}

/// Decides one acquire over the limits of several subjects at once (the Envoy descriptors of
/// one request), limit `i` with its own `costs[i]`: allowed only if every limit admits its cost,
/// and then every limit takes it; if any denies, none takes anything. Returns whether it was
/// allowed and each limit's decision, in order: when denied, each describes its limit as it
/// stands (`allowed` says whether it admitted). The slices are as long as `params`.
pub fn decide_joint(
    params: &[Params],
    states: &mut [Option<State>],
    ttls: &mut [Option<u64>],
    costs: &[u64],
    now_us: u64,
) -> (bool, Vec<Decision>) {
    let mut decisions = Vec::with_capacity(params.len());
    let mut look = |take: bool, decisions: &mut Vec<Decision>| {
        decisions.clear();
        for (i, p) in params.iter().enumerate() {
            let o = p.decide(states[i].take(), costs[i], now_us, take);
            states[i] = o.state;
            ttls[i] = o.ttl_us;
            decisions.push(o.decision);
        }
        decisions.iter().all(|d| d.allowed)
    };
    let allowed = look(false, &mut decisions);
    if allowed {
        look(true, &mut decisions);
    }
    (allowed, decisions)
}

/// Decides one operation over all of a policy's limits at once, as [`decide_all`] does for an
/// acquire. A peek decides as an acquire would and keeps every state as it was; a report takes
/// from every limit ([`Rule::report`]); a refund gives back to every limit ([`Rule::refund`]),
/// limit `i` within `marks[i]` when `marks` holds one per limit (a ticket's), or as it stands
/// when `marks` is empty. An allowed acquire and a report note each limit's refund count
/// ([`Verdict::marks`]): from the state it wrote, or, for a report that recorded nothing, the
/// one it left.
pub fn decide_op(
    params: &[Params],
    states: &mut [Option<State>],
    ttls: &mut [Option<u64>],
    op: Op,
    cost: u64,
    now_us: u64,
    marks: &[Mark],
) -> Verdict {
    let mut verdict = Verdict::at(now_us);
    match op {
        Op::Acquire | Op::Peek => {
            // One limit needs no second look; a peek never takes.
            let take = op == Op::Acquire && params.len() == 1;
            for (i, p) in params.iter().enumerate() {
                let o = p.decide(states[i].take(), cost, now_us, take);
                states[i] = o.state;
                ttls[i] = o.ttl_us;
                verdict.push(o.decision);
            }
            if op == Op::Acquire && !take && verdict.allowed {
                verdict = Verdict::at(now_us);
                for (i, p) in params.iter().enumerate() {
                    let o = p.decide(states[i].take(), cost, now_us, true);
                    states[i] = o.state;
                    ttls[i] = o.ttl_us;
                    verdict.push(o.decision);
                }
            }
        }
        Op::Report | Op::Refund => {
            for (i, p) in params.iter().enumerate() {
                let (o, units) = if op == Op::Report {
                    p.report(states[i].take(), cost, now_us)
                } else {
                    let mark = (marks.len() == params.len()).then(|| marks[i]);
                    p.refund(states[i].take(), cost, now_us, mark)
                };
                states[i] = o.state;
                ttls[i] = o.ttl_us;
                verdict.push_units(o.decision, units);
            }
        }
    }
    if verdict.allowed && matches!(op, Op::Acquire | Op::Report) {
        for (count, state) in verdict.refunded.iter_mut().zip(states.iter()) {
            *count = state.as_ref().map_or(0, State::refunded);
        }
    }
    verdict
}

/// The answer to one operation over a policy's limits: whether it was allowed, and each limit's
/// decision in policy order. A limit's `allowed` says whether it admitted the cost; when the
/// acquire was denied, nothing was taken from any limit, so each describes its limit as it
/// stands. A report or a refund is always allowed, and says per limit how many units it recorded
/// or gave back ([`Verdict::units`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    pub allowed: bool,
    /// The time of the decision (µs): Redis's clock, or the embedded store's.
    pub at_us: u64,
    /// The time an allowed acquire or a report took at ([`Mark::taken_us`]): `at_us`, or for a
    /// booking the later time it was booked for.
    pub taken_us: u64,
    len: usize,
    limits: [Decision; MAX_LIMITS],
    units: [u64; MAX_LIMITS],
    /// Per limit, after an allowed acquire or a report: the refund count of the state it left
    /// ([`Rule::refunded`]), which its ticket keeps ([`Mark::refunded`]).
    pub refunded: [u64; MAX_LIMITS],
}

impl Default for Verdict {
    /// Allowed, with no limits yet, at time 0.
    fn default() -> Self {
        Self::at(0)
    }
}

impl Verdict {
    /// Allowed, with no limits yet, decided at `at_us`.
    pub const fn at(at_us: u64) -> Self {
        const NONE: Decision = Decision {
            allowed: true,
            remaining: 0,
            reset_after_us: 0,
            retry_after_us: 0,
        };
        Self {
            allowed: true,
            at_us,
            taken_us: at_us,
            len: 0,
            limits: [NONE; MAX_LIMITS],
            units: [0; MAX_LIMITS],
            refunded: [0; MAX_LIMITS],
        }
    }

    /// The verdict of a one-limit policy.
    pub fn single(decision: Decision) -> Self {
        let mut v = Self::default();
        v.push(decision);
        v
    }

    /// Adds the next limit's decision: the verdict is allowed while every limit admits. More
    /// than [`MAX_LIMITS`] are ignored.
    pub fn push(&mut self, decision: Decision) {
        self.push_units(decision, 0);
    }

    /// Adds the next limit's decision and the units it recorded or gave back.
    pub fn push_units(&mut self, decision: Decision, units: u64) {
        if self.len < MAX_LIMITS {
            self.limits[self.len] = decision;
            self.units[self.len] = units;
            self.len += 1;
            self.allowed &= decision.allowed;
        }
    }

    /// Each limit's decision, in policy order.
    pub fn limits(&self) -> &[Decision] {
        &self.limits[..self.len]
    }

    /// Per limit, in policy order: the units a report recorded or a refund gave back (0 for an
    /// acquire or a peek).
    pub fn units(&self) -> &[u64] {
        &self.units[..self.len]
    }

    /// Per limit, the mark of what an allowed acquire or a report took ([`Mark`]): `at_us +
    /// reset_after_us`, the time its units stop counting (see [`Rule::refund`]); or, when that
    /// reset is at the longest wait a reply states ([`MAX_WAIT_US`], so the true one may be far
    /// longer: a huge backlog drained once a month), [`HELD_MARK`] `+ at_us`, which
    /// [`undrained`] reads without that cap; with the take's time and the limit's refund count.
    pub fn marks(&self) -> impl Iterator<Item = Mark> + '_ {
        self.limits()
            .iter()
            .zip(&self.refunded)
            .map(|(d, &refunded)| Mark {
                at: if d.reset_after_us >= MAX_WAIT_US {
                    HELD_MARK.saturating_add(self.at_us)
                } else {
                    self.at_us.saturating_add(d.reset_after_us)
                },
                taken_us: self.taken_us,
                refunded,
            })
    }

    /// The index of the limit that decided: on a denial, the denying limit with the longest
    /// `retry_after_us` (the time until the same request is allowed); when allowed, the limit
    /// with the fewest units remaining, and of those the longest `retry_after_us` (a limit in
    /// debt after a report). The first such in policy order.
    pub fn binding(&self) -> usize {
        let limits = self.limits();
        let mut best = 0;
        for (i, d) in limits.iter().enumerate().skip(1) {
            let b = &limits[best];
            let better = if self.allowed {
                // A report or a refund leaves limits with waits while allowed: of those with the
                // fewest units, the longest wait binds.
                d.remaining < b.remaining
                    || (d.remaining == b.remaining && d.retry_after_us > b.retry_after_us)
            } else {
                !d.allowed && (b.allowed || d.retry_after_us > b.retry_after_us)
            };
            if better {
                best = i;
            }
        }
        best
    }

    /// The binding limit's decision ([`Verdict::binding`]), allowed as the verdict is.
    pub fn decision(&self) -> Decision {
        let d = self
            .limits()
            .get(self.binding())
            .copied()
            .unwrap_or(Decision {
                allowed: self.allowed,
                remaining: 0,
                reset_after_us: 0,
                retry_after_us: 0,
            });
        Decision {
            allowed: self.allowed,
            ..d
        }
    }
}

/// The longest wait reported, in microseconds (2^50 µs, about 35.7 years). Larger waits (a huge
/// bucket refilled once a month) are reported as this, identically in Rust and in Lua.
pub const MAX_WAIT_US: u64 = 1 << 50;

/// Marks at or above this (2^52 µs, the year 2112) are not times: `HELD_MARK + at` is the mark
/// of a take decided at `at` whose units stop counting more than [`MAX_WAIT_US`] later (a huge
/// backlog drained once a month), past what a reply says. See [`Verdict::marks`].
pub const HELD_MARK: u64 = 1 << 52;

/// The time after which a refund gives nothing back with `mark` ([`Verdict::marks`]): the mark
/// itself, or for a held mark its take's time plus [`MAX_WAIT_US`] (a ticket's longest life).
pub fn mark_life_end(mark: u64) -> u64 {
    if mark >= HELD_MARK {
        (mark - HELD_MARK).saturating_add(MAX_WAIT_US)
    } else {
        mark
    }
}

/// The answer to one acquire. A denial is a decision like any other, not an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// Whether the units were granted.
    pub allowed: bool,
    /// Units still available after this call (never negative).
    pub remaining: u64,
    /// Time until the subject is back to its full quota, if nothing else arrives.
    pub reset_after_us: u64,
    /// Zero when allowed; otherwise the time until the same request would be allowed.
    pub retry_after_us: u64,
}

/// The result of one pure decision: the answer, and what the store must keep.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome<S> {
    pub decision: Decision,
    /// The state to keep, or `None` when the subject has no state worth keeping.
    pub state: Option<S>,
    /// `Some(ttl)`: the state was written and may be dropped `ttl` µs from now, when it no longer
    /// changes any answer. `None`: keep the previous expiry (nothing was consumed).
    pub ttl_us: Option<u64>,
}

impl<S> Outcome<S> {
    /// The same outcome with its state converted.
    pub fn map_state<T>(self, f: impl FnOnce(S) -> T) -> Outcome<T> {
        Outcome {
            decision: self.decision,
            state: self.state.map(f),
            ttl_us: self.ttl_us,
        }
    }
}

/// What a ticket keeps of one limit's take ([`Verdict::marks`]), from which a refund tells what
/// that take still holds ([`Rule::refund`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Mark {
    /// The time the take's units stop counting, or a held mark ([`HELD_MARK`]).
    pub at: u64,
    /// The take's time, [`Verdict::at_us`].
    pub taken_us: u64,
    /// The limit's refund count just after the take ([`Life::refunded`]; 0 for algorithms that
    /// keep none).
    pub refunded: u64,
}

impl Mark {
    pub const fn new(at: u64, taken_us: u64, refunded: u64) -> Self {
        Self {
            at,
            taken_us,
            refunded,
        }
    }
}

/// A token bucket's or a GCRA state's record of its own life, which a mark is read against
/// ([`undrained`]): when it began, and the units refunds have given back since. A life begins
/// whenever the subject is found at rest (a full bucket, a drained TAT, no state): every take
/// before then is spent, so no ticket taken before `since_us` holds anything. A count that would
/// reach [`LIFE_REFUNDS`] begins a new life at that refund, so that it stays exact in Lua.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Life {
    pub since_us: u64,
    pub refunded: u64,
}

/// The most units a [`Life`] counts as refunded (2^52): every number stays exact in Lua.
pub const LIFE_REFUNDS: u64 = 1 << 52;

impl Life {
    /// A life beginning at `t`.
    pub const fn at(t: u64) -> Self {
        Self {
            since_us: t,
            refunded: 0,
        }
    }

    /// The life after a refund at `t` gave back `given` units.
    pub fn refund(self, given: u64, t: u64) -> Self {
        match self.refunded.checked_add(given) {
            Some(refunded) if refunded < LIFE_REFUNDS => Self { refunded, ..self },
            _ => Self::at(t),
        }
    }
}

/// The units of a take still held at `t` by its `mark` ([`Verdict::marks`]), for an algorithm
/// whose units drain (GCRA) or refill (token bucket) at `per / every` a µs, in the order they
/// were taken, the take's behind every earlier one; a refund gives back at most these (of the
/// `units` it was asked).
/// - Nothing when the take came before the state's `life` began (it was spent by then), or its
///   refund count is past the life's (it counted in another life).
/// - A refund moves every later take's units up by the units it gave back (a refund of an
///   earlier take frees its place in the order; counted whatever it refunded, which may only
///   give less): the `shift`, the life's refunds since the take, comes off.
/// - A mark that is a time: `ceil((mark - 1 - t) * per / every) - shift`, the units between `t`
///   and the moved-up mark (`mark - 1`: a mark is the exact time rounded up to a µs, so the
///   exact one is later than `mark - 1`, and a count rounded up from it is rounded up from part
///   of a unit the take holds; `mark - 1 - t` capped at [`MAX_WAIT_US`], which no genuine mark
///   exceeds, so that every number stays exact in Lua).
/// - A held mark, `HELD_MARK + at` (the take at `at` left units counting past [`MAX_WAIT_US`]):
///   two lower bounds of what it still holds, the larger: the units that the time since the
///   take cannot have drained of the take's own (`units - floor(elapsed * per / every)`, as its
///   units were queued behind nothing at best, which no refund changes), and those still to go
///   before `at + MAX_WAIT_US`, which its moved-up units stop counting after
///   (`ceil((MAX_WAIT_US - elapsed) * per / every) - shift`). Never more than the take still
///   holds, and all of it for at least one unit's time after the take; nothing once
///   `MAX_WAIT_US` has passed since it (a ticket's longest life).
///
/// Also says whether the count is rounded up from a part of a unit (the take's oldest unit has
/// partly refilled or drained): a refund that gives that count back drops the part refilled so
/// far of the level's next unit ([`Held::partial`]), so that it is not given twice.
pub(crate) fn undrained(mark: Mark, t: u64, units: u64, per: u64, every: u64, life: Life) -> Held {
    let none = Held {
        units: 0,
        partial: false,
    };
    if mark.taken_us < life.since_us || mark.refunded > life.refunded {
        return none;
    }
    let shift = life.refunded - mark.refunded;
    let up = |d: u64| {
        let (q, r) = arith::muldiv(d, per, every);
        Held {
            units: q.saturating_add(u64::from(r > 0)).saturating_sub(shift),
            partial: r > 0,
        }
    };
    if mark.at < HELD_MARK {
        return up(until(mark.at.saturating_sub(1), t).min(MAX_WAIT_US));
    }
    let elapsed = t.saturating_sub(mark.at - HELD_MARK);
    if elapsed >= MAX_WAIT_US {
        return none;
    }
    let (drained, _) = arith::muldiv(elapsed, per, every);
    let own = units.saturating_sub(drained);
    let before_end = up(MAX_WAIT_US - elapsed);
    if before_end.units >= own {
        before_end
    } else {
        Held {
            units: own,
            partial: false,
        }
    }
}

/// What [`undrained`] finds a take still holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Held {
    pub units: u64,
    /// Rounded up from a part of a unit: giving all of `units` back gives that part twice
    /// unless the level's part refilled (or drained) so far goes with it.
    pub partial: bool,
}

/// `target - now`, or zero when `target` has passed.
pub(crate) fn until(target: u64, now: u64) -> u64 {
    target.saturating_sub(now)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decide(params: &[Params], states: &mut [Option<State>], cost: u64, now: u64) -> Verdict {
        let mut ttls = [None; MAX_LIMITS];
        decide_all(params, states, &mut ttls[..params.len()], cost, now)
    }

    #[test]
    fn a_denial_by_one_limit_takes_nothing_from_the_others() {
        // 3 per second and 5 per minute.
        let params = [
            Algorithm::FixedWindow.params(&[3, 1_000]),
            Algorithm::TokenBucket.params(&[5, 5, 60_000]),
        ];
        let mut states: [Option<State>; 2] = Default::default();
        for i in 0..3 {
            let v = decide(&params, &mut states, 1, i);
            assert!(v.allowed);
            assert_eq!(v.limits()[1].remaining, 4 - i);
        }
        let v = decide(&params, &mut states, 1, 10);
        assert!(!v.allowed);
        assert_eq!(v.binding(), 0);
        assert!(!v.limits()[0].allowed && v.limits()[1].allowed);
        assert_eq!(v.limits()[1].remaining, 2, "the bucket kept its tokens");
        assert_eq!(v.limits()[1].retry_after_us, 0);
        // A new second: the window admits again, and the bucket still has its 2.
        let v = decide(&params, &mut states, 2, 1_000_000);
        assert!(v.allowed);
        assert_eq!(v.limits()[1].remaining, 0);
        assert_eq!(v.binding(), 1, "the fewest remaining binds");
        let v = decide(&params, &mut states, 1, 1_000_001);
        assert!(!v.allowed);
        assert_eq!(v.binding(), 1);
        assert_eq!(v.decision().retry_after_us, v.limits()[1].retry_after_us);
    }

    #[test]
    fn the_binding_denial_is_the_longest_wait() {
        let mut v = Verdict::default();
        let d = |allowed, retry_after_us| Decision {
            allowed,
            remaining: 0,
            reset_after_us: 0,
            retry_after_us,
        };
        v.push(d(true, 0));
        v.push(d(false, 5));
        v.push(d(false, 9));
        v.push(d(false, 9));
        assert!(!v.allowed);
        assert_eq!(v.binding(), 2);
        assert_eq!(v.decision().retry_after_us, 9);
    }

    #[test]
    fn one_limit_decides_as_its_own_function() {
        let p = Algorithm::Gcra.params(&[10, 1_000, 3]);
        let mut states: [Option<State>; 1] = Default::default();
        let mut alone = None;
        for (now, cost) in [(0, 2), (1, 2), (100_000, 1), (150_000, 3)] {
            let v = decide(&[p], &mut states, cost, now);
            let o = p.decide(alone.take(), cost, now, true);
            alone = o.state;
            assert_eq!(v.limits(), &[o.decision]);
            assert_eq!(v.decision(), o.decision);
        }
    }
}
