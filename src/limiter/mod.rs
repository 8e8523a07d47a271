//! The decision logic of every algorithm, as pure functions.
//!
//! Each algorithm module exposes `acquire(state, params, cost, now_us) -> Outcome`: no I/O, no
//! clock reads, no allocation beyond the state it owns. The embedded store runs these functions
//! directly; the Lua scripts in `lua/` implement the same arithmetic on Redis, and the property
//! tests hold the two to identical answers on the same inputs.
//!
//! Shared rules, which every algorithm follows and the Lua scripts copy:
//! - time is integer microseconds; a `now` earlier than the time stored in the state is treated
//!   as the stored time, so a clock step back never refunds quota or reopens a window;
//! - a denied request changes no counter (the sliding log may drop entries that have left the
//!   window, which does not change what is allowed);
//! - callers guarantee `1 <= cost <= limit` (the API rejects larger costs before they get here);
//! - durations are measured from the caller's `now`, so a clock that stepped back gets waits that
//!   are long enough on its own clock.

pub mod arith;
pub mod fixed_window;
pub mod gcra;
pub mod sliding_window_counter;
pub mod sliding_window_log;
pub mod token_bucket;

/// What each algorithm's module provides, implemented on its `Params`: everything the stores and
/// the tests need to run it, so that nothing outside the module and the registry below matches
/// on the algorithm.
pub trait Rule: Copy {
    /// The algorithm's one name: JSON `algorithm`, `lua/<name>.lua`, state keys.
    const NAME: &'static str;
    /// What is kept per subject.
    type State: std::fmt::Debug + Send;
    /// The pure decision.
    fn decide(&self, state: Option<Self::State>, cost: u64, now_us: u64) -> Outcome<Self::State>;
    /// The script's arguments after `KEYS[1]`, in order, before `cost` and the time.
    fn script_args(&self) -> ScriptArgs;
    /// The most units one subject can be granted at once.
    fn quota(&self) -> u64;
}

/// A script's leading arguments, without allocating.
#[derive(Debug, Clone, Copy)]
pub struct ScriptArgs {
    args: [u64; 4],
    len: usize,
}

impl ScriptArgs {
    /// At most four arguments.
    pub fn new(args: &[u64]) -> Self {
        let mut out = [0; 4];
        let len = args.len().min(4);
        out[..len].copy_from_slice(&args[..len]);
        Self { args: out, len }
    }

    pub fn as_slice(&self) -> &[u64] {
        &self.args[..self.len]
    }
}

/// `Rule` for a window algorithm's `Params { limit, window_us }` and its module's `acquire`:
/// the three window algorithms take the same arguments.
macro_rules! window_rule {
    ($name:literal) => {
        impl super::Rule for Params {
            const NAME: &'static str = $name;
            type State = State;

            fn decide(&self, state: Option<State>, cost: u64, now_us: u64) -> Outcome<State> {
                acquire(state, self, cost, now_us)
            }

            fn script_args(&self) -> super::ScriptArgs {
                super::ScriptArgs::new(&[self.limit, self.window_us])
            }

            fn quota(&self) -> u64 {
                self.limit
            }
        }
    };
}
pub(crate) use window_rule;

/// The registry: every algorithm, its module and the Lua files of its script, named once. It
/// generates [`Algorithm`], [`Params`] and [`State`] and their dispatch.
macro_rules! algorithms {
    ($($variant:ident => $module:ident [$($lua:literal),+]),+ $(,)?) => {
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

            /// The decision script as sent to Redis: the flags line (a Redis 7 flagged script,
            /// refused whole while Redis is out of memory), `lua/common.lua`, then the
            /// algorithm's files, joined by newlines.
            pub const fn script(self) -> &'static str {
                match self {
                    $(Algorithm::$variant => concat!(
                        "#!lua\n",
                        include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/lua/common.lua")),
                        $("\n", include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/lua/", $lua))),+
                    )),+
                }
            }
        }

        /// An algorithm with its validated parameters, as its decision function takes them.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum Params {
            $($variant($module::Params)),+
        }

        /// One subject's state, tagged by algorithm.
        #[derive(Debug)]
        pub enum State {
            $($variant(<$module::Params as Rule>::State)),+
        }

        impl Params {
            pub const fn algorithm(&self) -> Algorithm {
                match self {
                    $(Params::$variant(_) => Algorithm::$variant),+
                }
            }

            /// The most units one subject can be granted at once: `limit` or `capacity`.
            pub fn quota(&self) -> u64 {
                match self {
                    $(Params::$variant(p) => Rule::quota(p)),+
                }
            }

            /// The script's arguments after `KEYS[1]`, before `cost` and the time.
            pub fn script_args(&self) -> ScriptArgs {
                match self {
                    $(Params::$variant(p) => Rule::script_args(p)),+
                }
            }

            /// Decides one acquire with the algorithm's pure function. State of another
            /// algorithm counts as none.
            pub fn decide(&self, state: Option<State>, cost: u64, now_us: u64) -> Outcome<State> {
                match self {
                    $(Params::$variant(p) => {
                        let state = match state {
                            Some(State::$variant(s)) => Some(s),
                            _ => None,
                        };
                        let o = Rule::decide(p, state, cost, now_us);
                        Outcome {
                            decision: o.decision,
                            state: o.state.map(State::$variant),
                            ttl_us: o.ttl_us,
                        }
                    }),+
                }
            }
        }
    };
}

algorithms! {
    FixedWindow => fixed_window ["fixed_window.lua"],
    SlidingWindowLog => sliding_window_log ["sliding_window_log.lua"],
    SlidingWindowCounter => sliding_window_counter ["muldiv.lua", "sliding_window_counter.lua"],
    TokenBucket => token_bucket ["muldiv.lua", "token_bucket.lua"],
    Gcra => gcra ["muldiv.lua", "gcra.lua"],
}

/// The longest wait reported, in microseconds (2^50 µs, about 35.7 years). Larger waits (a huge
/// bucket refilled once a month) are reported as this, identically in Rust and in Lua.
pub const MAX_WAIT_US: u64 = 1 << 50;

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

/// `target - now`, or zero when `target` has passed.
pub(crate) fn until(target: u64, now: u64) -> u64 {
    target.saturating_sub(now)
}
