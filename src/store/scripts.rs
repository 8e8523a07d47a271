//! The Lua scripts, embedded in the binary and called by SHA.
//!
//! A decision script is put together for the algorithms of a policy's limits, in order
//! ([`compose`]): the [`DECISION_FLAGS`] line, `lua/common.lua` (which explains the layout), the
//! helpers the algorithms need (`lua/muldiv.lua`), then one part per limit, each its
//! algorithm's `lua/<algorithm>.lua`, nested so that every limit is looked at before any takes
//! (see `lua/common.lua`). The script of a one-limit policy is the same text with one part, so
//! it stays the straight-line code of its algorithm. The registry in [`crate::limiter`] names
//! each algorithm's files. redis-rs sends `EVALSHA` and, on `NOSCRIPT` (a restarted or flushed
//! Redis, or a combination of algorithms not used before), loads the script and retries, so a
//! script is loaded once per Redis and never sent again in steady state.
//!
//! The flags line makes every decision script a Redis 7 flagged script, which Redis checks as a
//! whole before running it: while Redis is over `maxmemory` it refuses the call with an `OOM`
//! error and runs none of it. (An unflagged script is checked only up to its first write, so a
//! write that frees memory, such as `ZREMRANGEBYSCORE`, let every later write of the same script
//! through.) On a Cluster, flagged scripts also may not touch keys of another slot than their
//! declared ones, which ours never do: all of a subject's keys share one hash tag. Redis before
//! 7.0 cannot run them at all: it reads `#!` as a syntax error.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::{Arc, RwLock};

use redis::Script;

use crate::limiter::{Params, MAX_LIMITS};
use crate::policy::Algorithm;

/// The first line of every decision script: flagged, with no flag that would let it write past
/// `maxmemory` (`allow-oom`) or across slots (`allow-cross-slot-keys`).
pub const DECISION_FLAGS: &str = "#!lua";

const COMMON: &str = include_str!("../../lua/common.lua");

/// How a part reads a state kept in one string. In a script of several limits, every part that
/// reads its state this way has it read for it, all at once, by one `MGET` at the start: one
/// Redis call instead of one per limit.
const GET_STATE: &str = "local raw = redis.call('GET', key)";

/// The two lines that split an algorithm's part into its level, take and keep sections.
const TAKE: &str = "\n--- take\n";
const KEEP: &str = "\n--- keep\n";

/// An algorithm's part, split into its level, take and keep sections.
fn sections(algorithm: Algorithm) -> (&'static str, &'static str, &'static str) {
    let lua = algorithm.lua();
    let (level, rest) = lua.split_once(TAKE).unwrap_or((lua, ""));
    let (take, keep) = rest.split_once(KEEP).unwrap_or((rest, ""));
    (level, take, keep)
}

/// The decision script for limits of these algorithms, in policy order (at most
/// [`MAX_LIMITS`]), as sent to Redis.
pub fn compose(algorithms: &[Algorithm]) -> String {
    let algorithms = &algorithms[..algorithms.len().min(MAX_LIMITS)];
    let mut s = String::with_capacity(8_192);
    s.push_str(DECISION_FLAGS);
    s.push('\n');
    s.push_str(COMMON);
    let mut helpers: Vec<&str> = Vec::new();
    for a in algorithms {
        for &(name, text) in a.lua_helpers() {
            if !helpers.contains(&name) {
                helpers.push(name);
                s.push('\n');
                s.push_str(text);
            }
        }
    }
    s.push_str("\nlocal allowed, reply = true, {1");
    for _ in algorithms {
        s.push_str(", 0, 0, 0, 0");
    }
    s.push_str("}\n");
    // Parts that read one string, when there are several: one MGET for all of them.
    let strings: Vec<usize> = (0..algorithms.len())
        .filter(|&i| sections(algorithms[i]).0.contains(GET_STATE))
        .collect();
    let prefetch = strings.len() > 1;
    if prefetch {
        s.push_str("local raws = redis.call('MGET'");
        for i in &strings {
            let _ = write!(s, ", KEYS[{}]", i + 1);
        }
        s.push_str(")\n");
    }
    // Each part's parameters start after the cost, the time and the parameters before it.
    let mut offset = 2;
    for (i, a) in algorithms.iter().enumerate() {
        let (level, _, _) = sections(*a);
        // Writing to a String cannot fail.
        let _ = write!(
            s,
            "do -- limit {n}: {name}\nlocal key, a = KEYS[{n}], {offset}\n",
            n = i + 1,
            name = a.as_str()
        );
        match strings.iter().position(|&j| j == i) {
            Some(n) if prefetch => {
                s.push_str(&level.replacen(GET_STATE, &format!("local raw = raws[{}]", n + 1), 1))
            }
            _ => s.push_str(level),
        }
        s.push_str("\nif not admits then\n  allowed = false\nend\n");
        offset += a.fields().len();
    }
    for (i, a) in algorithms.iter().enumerate().rev() {
        let (_, take, keep) = sections(*a);
        s.push_str("local out_remaining, out_reset, out_retry = 0, 0, 0\nif allowed then\n");
        s.push_str(take);
        s.push_str("\nelse\n");
        s.push_str(keep);
        let at = 4 * i + 2;
        let _ = write!(
            s,
            "\nend\nreply[{}], reply[{}], reply[{}], reply[{}] = admits and 1 or 0, out_remaining, out_reset, out_retry\nend -- limit {}\n",
            at,
            at + 1,
            at + 2,
            at + 3,
            i + 1
        );
    }
    s.push_str("if not allowed then\n  reply[1] = 0\nend\nreturn reply\n");
    s
}

/// The policy scripts, which are not composed.
const POLICY_WRITE: &str = include_str!("../../lua/policy_write.lua");
const POLICY_READ: &str = include_str!("../../lua/policy_read.lua");

/// The source of every script loaded at start-up: the one-limit decision scripts and the
/// policy scripts. (Decision scripts of several limits are loaded on first use.)
pub fn sources() -> impl Iterator<Item = String> {
    Algorithm::ALL
        .into_iter()
        .map(|a| compose(&[a]))
        .chain([POLICY_WRITE.to_owned(), POLICY_READ.to_owned()])
}

/// A combination of algorithms as one number: each algorithm's index plus one, three bits each,
/// in policy order.
fn combination(limits: &[Params]) -> u32 {
    limits
        .iter()
        .fold(0, |code, p| code << 3 | (p.algorithm() as u32 + 1))
}

/// Every script, with its SHA computed once.
pub struct Scripts {
    /// One-limit decision scripts, by algorithm.
    singles: [Script; Algorithm::ALL.len()],
    /// Decision scripts of several limits, composed on first use.
    composed: RwLock<HashMap<u32, Arc<Script>>>,
    pub policy_write: Script,
    pub policy_read: Script,
}

/// A decision script, borrowed or shared.
pub enum DecisionScript<'a> {
    Single(&'a Script),
    Composed(Arc<Script>),
}

impl std::ops::Deref for DecisionScript<'_> {
    type Target = Script;

    fn deref(&self) -> &Script {
        match self {
            DecisionScript::Single(s) => s,
            DecisionScript::Composed(s) => s,
        }
    }
}

impl Scripts {
    pub fn new() -> Self {
        Self {
            singles: Algorithm::ALL.map(|a| Script::new(&compose(&[a]))),
            composed: RwLock::default(),
            policy_write: Script::new(POLICY_WRITE),
            policy_read: Script::new(POLICY_READ),
        }
    }

    /// The decision script for a policy's limits.
    pub fn decision(&self, limits: &[Params]) -> DecisionScript<'_> {
        if let [one] = limits {
            return DecisionScript::Single(&self.singles[one.algorithm() as usize]);
        }
        let code = combination(limits);
        if let Some(s) = self
            .composed
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&code)
        {
            return DecisionScript::Composed(s.clone());
        }
        let algorithms: Vec<Algorithm> = limits.iter().map(Params::algorithm).collect();
        let script = Arc::new(Script::new(&compose(&algorithms)));
        self.composed
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .entry(code)
            .or_insert(script)
            .clone()
            .into()
    }
}

impl From<Arc<Script>> for DecisionScript<'_> {
    fn from(s: Arc<Script>) -> Self {
        DecisionScript::Composed(s)
    }
}

impl Default for Scripts {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_decision_script_is_flagged_so_that_redis_refuses_it_whole_when_out_of_memory() {
        for a in Algorithm::ALL {
            let script = compose(&[a, Algorithm::FixedWindow]);
            let first = script.lines().next().unwrap_or_default();
            // Exactly `#!lua`: no `flags=` that could hold `allow-oom`.
            assert_eq!(first, DECISION_FLAGS, "{}", a.as_str());
        }
    }

    #[test]
    fn every_part_opens_with_its_keys_and_argv_and_has_its_three_sections() {
        for part in ["KEYS[i]", "ARGV[1]", "ARGV[2]", "Reply"] {
            assert!(COMMON.contains(part), "common.lua lacks {part}");
        }
        for a in Algorithm::ALL {
            let lua = a.lua();
            assert!(lua.starts_with(&format!("-- {}.lua", a.as_str())));
            let header: String = lua
                .lines()
                .take_while(|l| l.starts_with("--") || l.is_empty())
                .collect();
            assert!(header.contains("key "), "{} lacks its key", a.as_str());
            for (n, field) in a.fields().iter().enumerate() {
                let _ = field;
                let arg = format!("ARGV[a + {}]", n + 1);
                assert!(header.contains(&arg), "{} lacks {arg}", a.as_str());
            }
            assert_eq!(lua.matches(TAKE).count(), 1, "{}", a.as_str());
            assert_eq!(lua.matches(KEEP).count(), 1, "{}", a.as_str());
            let (level, _, _) = sections(a);
            assert!(level.contains("local admits ="), "{}", a.as_str());
        }
    }

    #[test]
    fn states_kept_in_strings_are_read_by_one_mget_when_there_are_several() {
        let script = compose(&[
            Algorithm::TokenBucket,
            Algorithm::SlidingWindowLog,
            Algorithm::FixedWindow,
        ]);
        assert!(script.contains("local raws = redis.call('MGET', KEYS[1], KEYS[3])"));
        assert!(script.contains("local raw = raws[1]") && script.contains("local raw = raws[2]"));
        assert!(!script.contains(GET_STATE));
        for a in Algorithm::ALL {
            let one = compose(&[a]);
            assert!(!one.contains("redis.call('MGET'"), "{}", a.as_str());
        }
    }

    #[test]
    fn a_helper_is_included_once() {
        let script = compose(&[Algorithm::TokenBucket, Algorithm::Gcra]);
        assert_eq!(script.matches("local function muldiv").count(), 1);
    }

    #[test]
    fn one_limit_scripts_are_indexed_by_algorithm() {
        let scripts = Scripts::new();
        for a in Algorithm::ALL {
            let params = a.params(&[1, 1, 1]);
            assert_eq!(
                scripts.decision(&[params]).get_hash(),
                Script::new(&compose(&[a])).get_hash()
            );
        }
    }
}
