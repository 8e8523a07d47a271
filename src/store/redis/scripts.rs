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
//! A concurrency limit is not composed: `lua/concurrency.lua` makes two scripts
//! ([`lease_sources`]), its look (flagged `no-writes`, like a peek's) and its change.
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
use std::sync::{Arc, LazyLock, RwLock};

use redis::Script;

use crate::limiter::{Op, Params, MAX_LIMITS};
use crate::policy::Algorithm;

/// The first line of every decision script that may write: flagged, with no flag that would let
/// it write past `maxmemory` (`allow-oom`) or across slots (`allow-cross-slot-keys`).
pub const DECISION_FLAGS: &str = "#!lua";

/// The first line of a peek's script: it writes nothing, so Redis lets it run with `EVALSHA_RO`,
/// on a replica, and while over `maxmemory`, and refuses it if it ever tried to write.
pub const PEEK_FLAGS: &str = "#!lua flags=no-writes";

const COMMON: &str = include_str!("../../../lua/common.lua");

/// How a part reads a state kept in one string. In a script of several limits, every part that
/// reads its state this way has it read for it, all at once, by one `MGET` at the start: one
/// Redis call instead of one per limit.
const GET_STATE: &str = "local raw = redis.call('GET', key)";

/// The lines that split an algorithm's part into its level, take, keep, report and refund
/// sections, in that order.
const SPLITS: [&str; 4] = [
    "\n--- take\n",
    "\n--- keep\n",
    "\n--- report\n",
    "\n--- refund\n",
];

/// An algorithm's part, split into its sections.
struct Part {
    level: &'static str,
    take: &'static str,
    keep: &'static str,
    report: &'static str,
    refund: &'static str,
}

fn part(algorithm: Algorithm) -> Part {
    let mut rest = algorithm.lua();
    let mut sections = [""; 5];
    for (i, split) in SPLITS.iter().enumerate() {
        let (before, after) = rest.split_once(split).unwrap_or((rest, ""));
        sections[i] = before;
        rest = after;
    }
    sections[4] = rest;
    let [level, take, keep, report, refund] = sections;
    Part {
        level,
        take,
        keep,
        report,
        refund,
    }
}

/// The script of one operation for limits of these algorithms, in policy order (at most
/// [`MAX_LIMITS`]), as sent to Redis.
pub fn compose(algorithms: &[Algorithm], op: Op) -> String {
    compose_as(algorithms, op, false)
}

/// The script of a joint acquire over limits of these algorithms, of several subjects (the
/// Envoy descriptors of one request), each with its own cost before its parameters (see
/// `lua/common.lua`), at most [`MAX_LIMITS`] in all.
pub fn compose_joint(algorithms: &[Algorithm]) -> String {
    compose_as(algorithms, Op::Acquire, true)
}

/// The script of a reservation over limits of these algorithms (`lua/reserve.lua`, which
/// explains the layout): `lua/common.lua` and the helpers, one look per limit (its level and keep
/// sections as a function of the time), an acquire's body as the function `take`, then the
/// file. Its keys are the limits' and the subject's queue; its ARGV an acquire's and the longest
/// wait accepted.
pub fn compose_reserve(algorithms: &[Algorithm]) -> String {
    let algorithms = &algorithms[..algorithms.len().min(MAX_LIMITS)];
    let n = algorithms.len();
    let mut s = String::with_capacity(16_384);
    s.push_str(DECISION_FLAGS);
    s.push('\n');
    s.push_str(COMMON);
    push_helpers(&mut s, algorithms);
    let mut offset = 2;
    for (i, a) in algorithms.iter().enumerate() {
        let p = part(*a);
        let _ = write!(
            s,
            "\n-- limit {n}: {name}, at the time `now`\nlocal function look_{n}(now)\nlocal key, a = KEYS[{n}], {offset}\n{level}\nlocal out_remaining, out_reset, out_retry, out_units, out_refunded = 0, 0, 0, 0, 0\n{keep}\nreturn admits, out_remaining, out_reset, out_retry\nend\n",
            n = i + 1,
            name = a.as_str(),
            level = p.level,
            keep = p.keep,
        );
        offset += a.arity();
    }
    s.push_str("\n-- An acquire at `now`, as lua/common.lua composes it.\nlocal function take()\n");
    push_body(&mut s, algorithms, Op::Acquire, false, false, false);
    s.push_str("end\n\nlocal looks = {");
    for i in 1..=n {
        let _ = write!(s, "{}look_{i}", if i > 1 { ", " } else { "" });
    }
    let _ = writeln!(
        s,
        "}}\nlocal n_limits, max_wait = {n}, tonumber(ARGV[{}])",
        offset + 1
    );
    s.push_str(RESERVE);
    s
}

const RESERVE: &str = include_str!("../../../lua/reserve.lua");

fn compose_as(algorithms: &[Algorithm], op: Op, joint: bool) -> String {
    let algorithms = &algorithms[..algorithms.len().min(MAX_LIMITS)];
    let mut s = String::with_capacity(8_192);
    s.push_str(if op == Op::Peek {
        PEEK_FLAGS
    } else {
        DECISION_FLAGS
    });
    s.push('\n');
    s.push_str(COMMON);
    push_helpers(&mut s, algorithms);
    push_body(
        &mut s,
        algorithms,
        op,
        joint,
        op == Op::Refund && !joint,
        true,
    );
    s
}

/// The helpers these algorithms need, each once.
fn push_helpers(s: &mut String, algorithms: &[Algorithm]) {
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
}

/// A decision script's body, after `lua/common.lua` and the helpers, down to `return reply`.
/// `joint`: each limit reads its own cost, from the argument before its parameters. `spent`: a
/// refund's, which keeps a ticket's record when it is given one ([`push_spent_head`]). `queue`:
/// the operation follows its subject's queue of reservations ([`push_queue`]); only a
/// reservation's own take (`lua/reserve.lua`, which reads the queue itself) does not.
fn push_body(
    s: &mut String,
    algorithms: &[Algorithm],
    op: Op,
    joint: bool,
    spent: bool,
    queue: bool,
) {
    let parts: Vec<Part> = algorithms.iter().map(|a| part(*a)).collect();
    let n = algorithms.len();
    // An acquire's and a report's reply end with each limit's refund count (`out_refunded`).
    let counted = matches!(op, Op::Acquire | Op::Report);
    s.push_str("\nlocal allowed, reply = true, {1");
    for _ in algorithms {
        s.push_str(", 0, 0, 0, 0");
    }
    s.push_str(", now");
    if counted {
        for _ in algorithms {
            s.push_str(", 0");
        }
    }
    s.push_str("}\n");
    // Parts that read one string, when there are several: one MGET for all of them.
    let strings: Vec<usize> = (0..parts.len())
        .filter(|&i| parts[i].level.contains(GET_STATE))
        .collect();
    let prefetch = strings.len() > 1;
    if prefetch {
        s.push_str("local raws = redis.call('MGET'");
        for i in &strings {
            let _ = write!(s, ", KEYS[{}]", i + 1);
        }
        s.push_str(")\n");
        // MGET answers nil for a key of another type, where the one-limit script's GET fails
        // with WRONGTYPE: a state missing from the answer is read again with GET, so that a key
        // this script did not write fails the whole call before any part writes, and is never
        // taken for a new subject and overwritten. Only missing states pay for it (new
        // subjects, one GET each).
        for (n, i) in strings.iter().enumerate() {
            let _ = writeln!(
                s,
                "if not raws[{}] then\n  redis.call('GET', KEYS[{}])\nend",
                n + 1,
                i + 1
            );
        }
    }
    // The subject's queue, once for all limits; a joint acquire's limits are of several
    // subjects, each part reads its own. `caller` keeps the caller's time for a ticket's record
    // too; a script that reads no queue and keeps no record (`lua/reserve.lua`'s `take`, whose
    // caller moves `now` itself) needs neither.
    if queue || spent {
        s.push_str("local caller, shift = now, 0\n");
    }
    if queue && !joint {
        push_queue(s, "KEYS[1]", op);
    }
    // Each part's parameters start after the cost, the time and the parameters before it; a
    // refund's marks follow all of them: one time per limit, one refund count per limit, and
    // the take's time.
    let params: usize = algorithms.iter().map(|a| a.arity()).sum();
    let marks_end = 2 + params + 2 * n + 1;
    if op == Op::Refund {
        let _ = writeln!(s, "local mark_taken = tonumber(ARGV[{marks_end}])");
    }
    if spent {
        push_spent_head(s, n, marks_end);
    }
    let mut offset = 2;
    for (i, (a, p)) in algorithms.iter().zip(&parts).enumerate() {
        // Writing to a String cannot fail.
        let _ = write!(
            s,
            "do -- limit {n}: {name}\nlocal key, a = KEYS[{n}], {offset}\n",
            n = i + 1,
            name = a.as_str()
        );
        if joint {
            offset += 1;
            let _ = writeln!(s, "local cost = tonumber(ARGV[a + 1])\na = {offset}");
            if queue {
                s.push_str("local now, shift, take_delay_us = caller, 0, 0\n");
                push_queue(s, "key", op);
            }
        }
        if op == Op::Refund {
            let _ = writeln!(
                s,
                "local mark, mark_refunded = tonumber(ARGV[{}]), tonumber(ARGV[{}])",
                2 + params + i + 1,
                2 + params + n + i + 1
            );
        }
        match strings.iter().position(|&j| j == i) {
            Some(n) if prefetch => s.push_str(&p.level.replacen(
                GET_STATE,
                &format!("local raw = raws[{}]", n + 1),
                1,
            )),
            _ => s.push_str(p.level),
        }
        s.push_str("\nif not admits then\n  allowed = false\nend\n");
        offset += a.arity();
    }
    for (i, p) in parts.iter().enumerate().rev() {
        s.push_str(
            "local out_remaining, out_reset, out_retry, out_units, out_refunded = 0, 0, 0, 0, 0\n",
        );
        let first = match op {
            Op::Acquire => {
                s.push_str("if allowed then\n");
                s.push_str(p.take);
                s.push_str("\nelse\n");
                s.push_str(p.keep);
                s.push_str("\nend\n");
                "admits and 1 or 0"
            }
            Op::Peek => {
                s.push_str(p.keep);
                s.push('\n');
                "admits and 1 or 0"
            }
            Op::Report => {
                s.push_str(p.report);
                s.push('\n');
                "out_units"
            }
            Op::Refund => {
                s.push_str(p.refund);
                s.push('\n');
                "out_units"
            }
        };
        let at = 4 * i + 2;
        let _ = writeln!(
            s,
            "reply[{}], reply[{}], reply[{}], reply[{}] = {first}, out_remaining, out_reset, out_retry",
            at,
            at + 1,
            at + 2,
            at + 3,
        );
        if counted {
            let _ = writeln!(s, "reply[{}] = out_refunded", 4 * n + 3 + i);
        }
        if queue {
            push_queued_reply(s, op, at);
        }
        let _ = writeln!(s, "end -- limit {}", i + 1);
    }
    // A report or a refund is always allowed; an acquire or a peek when every limit admits.
    if matches!(op, Op::Acquire | Op::Peek) {
        s.push_str("if not allowed then\n  reply[1] = 0\nend\n");
    }
    if spent {
        push_spent_tail(s, n, marks_end);
    }
    if queue && matches!(op, Op::Report | Op::Refund) {
        // Decided at the queue's time: the reply says when (`taken_us`), one number more.
        s.push_str("if shift > 0 then\n  reply[#reply + 1] = now\nend\n");
    }
    s.push_str("return reply\n");
}

/// Reads the queue of reservations of the subject whose state key is `key` (a Lua expression):
/// `<prefix>:{<policy>:<key>}:queue` (`store::key::queue_key`), the latest time anything is
/// booked for (see `lua/reserve.lua`), on the tag every state key of the subject opens with
/// (the prefix holds no `}`, and an escaped key none either). While it is ahead of `now`, the
/// operation is decided as `limiter::reservation::decide_queued` decides it: at the queue's
/// time (`now` moves there, `shift` after the caller's, and every expiry written moves with
/// it, `take_delay_us`), and an acquire or a peek is denied, since the queue is ahead of it.
/// Missing or passed, nothing changes: one GET.
fn push_queue(s: &mut String, key: &str, op: Op) {
    let _ = writeln!(
        s,
        "local queued = tonumber(redis.call('GET', string.match({key}, '^[^}}]*}}') .. ':queue') or '')\n\
         if queued and queued > now then\n  \
           shift = queued - now\n  \
           now, take_delay_us = queued, shift{deny}\n\
         end",
        deny = if matches!(op, Op::Acquire | Op::Peek) {
            "\n  allowed = false"
        } else {
            ""
        }
    );
}

/// After a limit's reply at `reply[at]`, in a decision moved to its queue's time
/// ([`push_queue`]): its times measured from the caller's now. An acquire or a peek is denied by
/// every limit, with the wait for the queue plus the limit's own from there (none when it
/// admits there), as a reservation that accepts no wait is (`lua/reserve.lua`'s denial).
fn push_queued_reply(s: &mut String, op: Op, at: usize) {
    let (reset, retry) = (at + 2, at + 3);
    let _ = writeln!(
        s,
        "if shift > 0 then\n  reply[{reset}] = math.min(reply[{reset}] + shift, MAX_WAIT_US)"
    );
    let _ = if matches!(op, Op::Acquire | Op::Peek) {
        writeln!(
            s,
            "  reply[{retry}] = math.min(shift + (reply[{at}] == 1 and 0 or math.max(reply[{retry}], 1)), MAX_WAIT_US)\n  \
               reply[{at}] = 0\n\
             end"
        )
    } else {
        writeln!(
            s,
            "  if reply[{retry}] > 0 then\n    \
                 reply[{retry}] = math.min(reply[{retry}] + shift, MAX_WAIT_US)\n  \
               end\n\
             end"
        )
    };
}

/// The start of a refund that keeps a ticket's record, for `n` limits whose mark arguments end at
/// `ARGV[last]`: when the script is given one more key than limits, that key is the ticket's
/// record (on the subject's hash tag: `store::key::ticket_record`), and the ticket's units and
/// the end of its life are `ARGV[last + 1]` and `ARGV[last + 2]`. The refund then gives back at
/// most the units the record does not hold yet; the algorithms' parts see only a lower `cost`.
/// Without that key (a refund without a ticket) it changes nothing.
fn push_spent_head(s: &mut String, n: usize, last: usize) {
    let _ = write!(
        s,
        "-- A ticket's record: the units refunded with it so far, read and added to in this one\n\
         -- atomic call, so that however often and concurrently it is sent, it never gives back\n\
         -- more than it took.\n\
         local spent_key, spent = KEYS[{key}], 0\n\
         if spent_key then\n  \
           spent = tonumber(redis.call('GET', spent_key) or '0') or 0\n  \
           local left = math.max(tonumber(ARGV[{units}]) - spent, 0)\n  \
           if left < cost then\n    cost = left\n  end\nend\n",
        key = n + 1,
        units = last + 1,
    );
}

/// The end of a refund that keeps a ticket's record ([`push_spent_head`]): adds the most any
/// limit gave back (so that no limit's refunds with the ticket ever pass its units), kept until
/// the ticket can give nothing back any more.
fn push_spent_tail(s: &mut String, n: usize, last: usize) {
    let _ = write!(
        s,
        "if spent_key then\n  \
           local given = 0\n  \
           for i = 1, {n} do\n    \
             if reply[4 * i - 2] > given then\n      given = reply[4 * i - 2]\n    end\n  \
           end\n  \
           local ttl = math.ceil((tonumber(ARGV[{end_}]) - caller) / 1000)\n  \
           if given > 0 and ttl > 0 then\n    \
             redis.call('SET', spent_key, string.format('%d', spent + given), 'PX', string.format('%d', ttl))\n  \
           end\nend\n",
        end_ = last + 2,
    );
}

/// The operations a batch decides: those that may write (a peek is read-only and goes alone,
/// with `EVALSHA_RO`).
pub const BATCHED_OPS: [Op; 3] = [Op::Acquire, Op::Report, Op::Refund];

const BATCH: &str = include_str!("../../../lua/batch.lua");
/// The lines of `lua/batch.lua` where the helpers go, and where each decision's function is
/// defined on first use.
const BATCH_HELPERS: &str = "\n--- helpers\n";
const BATCH_FUNCTIONS: &str = "\n  --- functions\n";

/// A one-limit decision's function number in the batch script: 1 + its operation's place in
/// [`BATCHED_OPS`] times the number of algorithms + the algorithm's index.
pub fn batch_code(op: Op, algorithm: Algorithm) -> Option<usize> {
    let op = BATCHED_OPS.iter().position(|o| *o == op)?;
    Some(1 + op * Algorithm::ALL.len() + algorithm as usize)
}

/// The first line of the batch script for a Cluster, whose keys it takes in ARGV: they are in
/// several slots of one master (see `lua/batch.lua`).
pub const CROSS_SLOT_FLAGS: &str = "#!lua flags=allow-cross-slot-keys";

/// The batch script (`lua/batch.lua`): the helpers once, then, for each one-limit decision of a
/// batched operation, its script's text (`lua/common.lua` and the body) as a function of its
/// own `KEYS` and `ARGV`, defined only when a batch holds such a decision. `cross_slot`: the
/// Cluster's, flagged to reach keys of several slots (given in ARGV).
pub fn batch_source(cross_slot: bool) -> String {
    let (head, rest) = BATCH.split_once(BATCH_HELPERS).unwrap_or((BATCH, ""));
    let (code, tail) = rest.split_once(BATCH_FUNCTIONS).unwrap_or((rest, ""));
    let mut s = String::with_capacity(96 * 1024);
    s.push_str(if cross_slot {
        CROSS_SLOT_FLAGS
    } else {
        DECISION_FLAGS
    });
    s.push('\n');
    s.push_str(head);
    // Defined before the loop: upvalues of every function, created once per call.
    push_helpers(&mut s, &Algorithm::ALL);
    s.push_str(code);
    s.push('\n');
    let mut first = true;
    for op in BATCHED_OPS {
        for a in Algorithm::ALL {
            let Some(code) = batch_code(op, a) else {
                continue;
            };
            let _ = writeln!(
                s,
                "    {} code == {code} then -- {} {}\n      f = function(key, o)",
                if first { "if" } else { "elseif" },
                op.as_str(),
                a.as_str()
            );
            first = false;
            // The one-limit script's text as a function of its key and of where its arguments
            // start in the batch's ARGV (read in place: no table per decision), without its
            // comment lines (the one-limit scripts keep them; fifteen copies would take the
            // script past what one argument of a command line may hold).
            let mut function = String::from(COMMON);
            push_body(&mut function, &[a], op, false, false, true);
            for line in function.lines() {
                let code = line.trim_start();
                if !code.is_empty() && !code.starts_with("--") {
                    s.push_str(&line.replace("KEYS[1]", "key").replace("ARGV[", "ARGV[o + "));
                    s.push('\n');
                }
            }
            s.push_str("      end\n");
        }
    }
    s.push_str("    end\n");
    s.push_str(tail);
    s
}

/// The concurrency limit's file, split into its head, the look and the change sections (see
/// its header).
const CONCURRENCY: &str = include_str!("../../../lua/concurrency.lua");
const LOOK_SPLIT: &str = "\n--- look\n";
const CHANGE_SPLIT: &str = "\n--- change\n";

/// The two scripts of a concurrency limit: `(look, change)`. The look is flagged `no-writes`
/// and called with `EVALSHA_RO`; the change (take, renew, release, sweep) may write.
pub fn lease_sources() -> (String, String) {
    let (head, rest) = CONCURRENCY
        .split_once(LOOK_SPLIT)
        .unwrap_or((CONCURRENCY, ""));
    let (look, change) = rest.split_once(CHANGE_SPLIT).unwrap_or((rest, ""));
    (
        format!("{PEEK_FLAGS}\n{head}\n{look}"),
        format!("{DECISION_FLAGS}\n{head}\n{change}"),
    )
}

/// The policy scripts, which are not composed.
const POLICY_WRITE: &str = include_str!("../../../lua/policy_write.lua");
const POLICY_READ: &str = include_str!("../../../lua/policy_read.lua");
const OVERRIDE_WRITE: &str = include_str!("../../../lua/override_write.lua");

/// The source of every script loaded at start-up: the one-limit decision scripts, the batch
/// scripts and the policy scripts. (Decision scripts of several limits are loaded on first use.)
pub fn sources() -> impl Iterator<Item = String> {
    Op::ALL
        .into_iter()
        .flat_map(|op| Algorithm::ALL.into_iter().map(move |a| compose(&[a], op)))
        .chain([
            POLICY_WRITE.to_owned(),
            POLICY_READ.to_owned(),
            OVERRIDE_WRITE.to_owned(),
            batch_source(false),
            batch_source(true),
        ])
        .chain(<[String; 2]>::from(lease_sources()))
}

/// An operation and a combination of algorithms as one number: each algorithm's index plus one,
/// three bits each, in policy order, after the operation's index.
fn combination(limits: &[Params], op: Op) -> u32 {
    limits
        .iter()
        .fold(op as u32, |code, p| code << 3 | (p.algorithm() as u32 + 1))
}

/// Every script, with its SHA computed once.
pub struct Scripts {
    /// One-limit decision scripts, by operation and algorithm.
    singles: [[Script; Algorithm::ALL.len()]; Op::ALL.len()],
    /// Decision scripts of several limits, composed on first use.
    composed: RwLock<HashMap<u32, Arc<Script>>>,
    /// Joint acquires' scripts, by combination of algorithms, composed on first use.
    joint: RwLock<HashMap<u32, Arc<Script>>>,
    /// Reservations' scripts, by combination of algorithms, composed on first use.
    reserve: RwLock<HashMap<u32, Arc<Script>>>,
    pub policy_write: Script,
    pub policy_read: Script,
    pub override_write: Script,
    /// A concurrency limit's look (no writes, `EVALSHA_RO`).
    pub lease_look: Script,
    /// A concurrency limit's take, renew and release.
    pub lease_change: Script,
}

/// The batch scripts, put together once: one Redis's, and a Cluster's.
static BATCH_SCRIPTS: LazyLock<[Script; 2]> =
    LazyLock::new(|| [false, true].map(|cross_slot| Script::new(&batch_source(cross_slot))));

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
            singles: Op::ALL.map(|op| Algorithm::ALL.map(|a| Script::new(&compose(&[a], op)))),
            composed: RwLock::default(),
            joint: RwLock::default(),
            reserve: RwLock::default(),
            policy_write: Script::new(POLICY_WRITE),
            policy_read: Script::new(POLICY_READ),
            override_write: Script::new(OVERRIDE_WRITE),
            lease_look: Script::new(&lease_sources().0),
            lease_change: Script::new(&lease_sources().1),
        }
    }

    /// Several one-limit decisions in one call (`lua/batch.lua`); `cross_slot`: a Cluster's.
    pub fn batch(cross_slot: bool) -> &'static Script {
        &BATCH_SCRIPTS[usize::from(cross_slot)]
    }

    /// The script of one operation on one limit of this algorithm.
    pub fn single(&self, op: Op, algorithm: Algorithm) -> &Script {
        &self.singles[op as usize][algorithm as usize]
    }

    /// The script of one operation on a policy's limits.
    pub fn decision(&self, limits: &[Params], op: Op) -> DecisionScript<'_> {
        if let [one] = limits {
            return DecisionScript::Single(&self.singles[op as usize][one.algorithm() as usize]);
        }
        once(&self.composed, combination(limits, op), || {
            let algorithms: Vec<Algorithm> = limits.iter().map(Params::algorithm).collect();
            compose(&algorithms, op)
        })
        .into()
    }

    /// The script of a joint acquire over limits with these parameters, in order.
    pub fn joint(&self, limits: &[Params]) -> Arc<Script> {
        once(&self.joint, combination(limits, Op::Acquire), || {
            let algorithms: Vec<Algorithm> = limits.iter().map(Params::algorithm).collect();
            compose_joint(&algorithms)
        })
    }
}

impl Scripts {
    /// The script of a reservation over limits with these parameters, in order.
    pub fn reserve(&self, limits: &[Params]) -> Arc<Script> {
        once(&self.reserve, combination(limits, Op::Acquire), || {
            let algorithms: Vec<Algorithm> = limits.iter().map(Params::algorithm).collect();
            compose_reserve(&algorithms)
        })
    }
}

/// The script of `code` in `cache`, composed from `source` the first time it is asked for.
fn once(
    cache: &RwLock<HashMap<u32, Arc<Script>>>,
    code: u32,
    source: impl FnOnce() -> String,
) -> Arc<Script> {
    if let Some(s) = cache.read().unwrap_or_else(|e| e.into_inner()).get(&code) {
        return s.clone();
    }
    let script = Arc::new(Script::new(&source()));
    cache
        .write()
        .unwrap_or_else(|e| e.into_inner())
        .entry(code)
        .or_insert(script)
        .clone()
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
            for op in [Op::Acquire, Op::Report, Op::Refund] {
                let script = compose(&[a, Algorithm::FixedWindow], op);
                let first = script.lines().next().unwrap_or_default();
                // Exactly `#!lua`: no `flags=` that could hold `allow-oom`.
                assert_eq!(first, DECISION_FLAGS, "{} {op:?}", a.as_str());
            }
            let peek = compose(&[a, Algorithm::FixedWindow], Op::Peek);
            assert_eq!(peek.lines().next(), Some(PEEK_FLAGS));
        }
    }

    #[test]
    fn every_part_opens_with_its_keys_and_argv_and_has_its_five_sections() {
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
            for split in SPLITS {
                assert_eq!(lua.matches(split).count(), 1, "{} {split}", a.as_str());
            }
            let p = part(a);
            assert!(p.level.contains("local admits ="), "{}", a.as_str());
            for (name, section) in [
                ("take", p.take),
                ("keep", p.keep),
                ("report", p.report),
                ("refund", p.refund),
            ] {
                assert!(!section.trim().is_empty(), "{} {name}", a.as_str());
            }
        }
    }

    #[test]
    fn states_kept_in_strings_are_read_by_one_mget_when_there_are_several() {
        let script = compose(
            &[
                Algorithm::TokenBucket,
                Algorithm::SlidingWindowLog,
                Algorithm::FixedWindow,
            ],
            Op::Acquire,
        );
        assert!(script.contains("local raws = redis.call('MGET', KEYS[1], KEYS[3])"));
        assert!(script.contains("local raw = raws[1]") && script.contains("local raw = raws[2]"));
        assert!(!script.contains(GET_STATE));
        for a in Algorithm::ALL {
            let one = compose(&[a], Op::Acquire);
            assert!(!one.contains("redis.call('MGET'"), "{}", a.as_str());
        }
    }

    #[test]
    fn the_lease_scripts_are_the_head_and_one_section_each_the_look_read_only() {
        let (look, change) = lease_sources();
        assert!(CONCURRENCY.starts_with("-- concurrency.lua"));
        for part in ["KEYS[1]", "ARGV[1]", "ARGV[6]", "Reply"] {
            assert!(CONCURRENCY.contains(part), "concurrency.lua lacks {part}");
        }
        assert_eq!(CONCURRENCY.matches(LOOK_SPLIT).count(), 1);
        assert_eq!(CONCURRENCY.matches(CHANGE_SPLIT).count(), 1);
        assert_eq!(look.lines().next(), Some(PEEK_FLAGS));
        assert_eq!(change.lines().next(), Some(DECISION_FLAGS));
        // The look's text holds no command that writes.
        for write in ["'ZADD'", "'ZREM", "'DEL'", "'PEXPIRE"] {
            assert!(!look.contains(write), "look has {write}");
            assert!(change.contains(write), "change lacks {write}");
        }
        assert!(look.contains("in_use = held - dead_cost"));
        assert!(change.contains("in_use = held - dead_cost"));
        // The ledger's grace is the one the model states.
        let grace = format!(
            "local LEDGER_GRACE_MS = {}\n",
            crate::limiter::concurrency::LEDGER_GRACE_MS
        );
        assert_eq!(CONCURRENCY.matches(&grace).count(), 1);
    }

    #[test]
    fn the_batch_script_defines_each_batched_decision_once_and_fits_one_argument() {
        for (cross_slot, flags) in [(false, DECISION_FLAGS), (true, CROSS_SLOT_FLAGS)] {
            let s = batch_source(cross_slot);
            assert_eq!(s.lines().next(), Some(flags));
            // A command line's one argument holds at most 128 KiB (redis-cli, operators).
            assert!(s.len() < 128 * 1024, "{} bytes", s.len());
            assert_eq!(s.matches("local function muldiv").count(), 1);
            for op in BATCHED_OPS {
                for a in Algorithm::ALL {
                    let code = batch_code(op, a).unwrap_or_default();
                    assert_eq!(s.matches(&format!(" code == {code} then")).count(), 1);
                }
            }
            assert_eq!(batch_code(Op::Peek, Algorithm::FixedWindow), None);
            // Each function reads its own key and its arguments in place.
            let start = s.find("f = function").unwrap_or_default();
            let end = s.find("functions[code] = f").unwrap_or_default();
            let functions = &s[start..end];
            assert!(!functions.contains("KEYS["));
            assert_eq!(
                functions.matches("ARGV[").count(),
                functions.matches("ARGV[o + ").count()
            );
            assert_eq!(s.matches("f = function(key, o)").count(), 15);
        }
    }

    #[test]
    fn the_sliding_log_touches_as_many_members_as_its_model_says() {
        let reach = format!(
            "\nlocal REACH = {} -- ",
            crate::limiter::sliding_window_log::REACH
        );
        assert_eq!(Algorithm::SlidingWindowLog.lua().matches(&reach).count(), 1);
    }

    #[test]
    fn a_missing_state_is_read_again_so_that_a_key_of_another_type_fails_the_script() {
        let script = compose(
            &[Algorithm::TokenBucket, Algorithm::FixedWindow],
            Op::Refund,
        );
        let mget = script.find("redis.call('MGET'").unwrap_or_default();
        let first = script.find("do -- limit 1").unwrap_or_default();
        for n in 1..=2 {
            let again = format!("if not raws[{n}] then\n  redis.call('GET', KEYS[{n}])\nend");
            let at = script.find(&again).unwrap_or_default();
            assert!(mget < at && at < first, "{again}");
        }
    }

    #[test]
    fn a_helper_is_included_once() {
        let script = compose(&[Algorithm::TokenBucket, Algorithm::Gcra], Op::Acquire);
        assert_eq!(script.matches("local function muldiv").count(), 1);
    }

    #[test]
    fn one_limit_scripts_are_indexed_by_algorithm() {
        let scripts = Scripts::new();
        for a in Algorithm::ALL {
            let params = a.params(&[1, 1, 1]);
            for op in Op::ALL {
                assert_eq!(
                    scripts.decision(&[params], op).get_hash(),
                    Script::new(&compose(&[a], op)).get_hash()
                );
            }
        }
    }
}
