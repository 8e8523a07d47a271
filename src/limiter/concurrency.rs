//! Concurrency limits: at most `limit` units held at once, by leases that expire when their
//! holder neither renews nor releases them.
//!
//! A rate limit bounds how often; this bounds how many at once (exports running per customer,
//! open streams per API key). Each lease holds `cost` units until it is released, or until its
//! expiry passes: a holder that dies frees its slot at the expiry, never later. A lease is named
//! within its subject by a member string, `<32 hex digits>:<cost>`, that the service draws at
//! random; its expiry is renewed from now by a renewal.
//!
//! The decision is [`decide`], a pure function of the subject's leases, the call and the time;
//! `lua/concurrency.lua` makes the same decisions on Redis, with Redis's clock, and the tests
//! hold the two to identical answers. The rules:
//!
//! - A lease is live while its expiry is after now. Every call but `Look` first drops the
//!   expired ones and counts them in `expired`; `in_use` is the sum of the live leases' costs.
//! - `Take` grants iff `in_use + cost <= limit`; a member that is live already is renewed
//!   instead (granted whatever the limit, never counted twice). A denial's `retry_after_us` is
//!   the time until the earliest live lease expires (0 when none is live: nothing will free).
//! - `Renew` sets a live lease's expiry to `lease_us` from now (which may shorten it); a lease
//!   that is not live is not renewed (an expired one has been dropped).
//! - `Release` removes the member; `ok` says whether it was live.
//! - `Reset` removes every lease of the subject (an operator's tool for a stuck holder); `ok`
//!   says whether any was live. Their ids are unknown from then on.
//! - A `Take` with a `deadline_us` that is decided after it grants nothing and changes nothing
//!   (`ok` false, no wait): its sender gave up waiting for the answer long before, and answered
//!   its client without it (see `service::undo`), so a lease it would grant is held by nobody.
//! - `Look` writes and drops nothing: `ok` iff `in_use + cost <= limit` (live leases only),
//!   `retry_after_us` as a denied take's.
//! - The subject's key expires when its last lease would: every call that changes the leases
//!   sets the key's expiry to the latest lease expiry; a call that changes nothing leaves it,
//!   and a call that leaves no lease deletes the key.
//!
//! A policy also keeps a [`Ledger`] of every live lease of all its subjects, by expiry: it is
//! what `ratelimiter_leases_in_use` and the count of expired leases are read from, exactly and
//! whichever instance asks. A lease enters it when taken, moves when renewed, and leaves when
//! released, or when any call on the policy but `Look` finds its expiry passed: that removal is
//! the one moment an expiry is counted (`expired`), so each is counted once, even when its
//! subject's key has expired with it and no call will ever touch that subject again. `Sweep`
//! does only that, for the service's periodic count.

use std::collections::{BTreeMap, BTreeSet, HashMap};

/// The largest `limit`: it bounds a subject's leases (each holds at least one unit).
pub const MAX_LIMIT: u64 = 10_000;
/// The longest `lease_ms`, one day: a holder that needs longer renews.
pub const MAX_LEASE_MS: u64 = 86_400_000;

/// How long a policy's ledger outlives its last lease, in ms: the service sweeps every ledger
/// once a second, and must find the leases that expire last to count them (`lua/concurrency.lua`
/// has the same constant).
pub const LEDGER_GRACE_MS: u64 = 60_000;

/// A concurrency limit's validated parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Params {
    /// Units held at once, at most.
    pub limit: u64,
    /// A lease's lifetime when the call names none, in µs.
    pub lease_us: u64,
    /// The longest lifetime a call may ask for, in µs (at least `lease_us`).
    pub max_lease_us: u64,
}

/// What a lease call does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseOp {
    /// Take a new lease of `cost` units for `lease_us`, if they fit.
    Take,
    /// Extend a live lease to `lease_us` from now.
    Renew,
    /// End a lease, live or not.
    Release,
    /// Say whether `cost` units would fit now, writing nothing.
    Look,
    /// Drop the policy's expired leases from its ledger and count them, touching no subject.
    Sweep,
    /// End every lease of the subject.
    Reset,
}

impl LeaseOp {
    pub const fn as_str(self) -> &'static str {
        match self {
            LeaseOp::Take => "take",
            LeaseOp::Renew => "renew",
            LeaseOp::Release => "release",
            LeaseOp::Look => "look",
            LeaseOp::Sweep => "sweep",
            LeaseOp::Reset => "reset",
        }
    }
}

/// One lease call on one subject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseCall<'a> {
    pub op: LeaseOp,
    /// The lease's member string, `<32 hex digits>:<cost>` (unused by `Look`).
    pub member: &'a str,
    /// Units the lease holds (`Take`, `Look`).
    pub cost: u64,
    /// The lifetime to give the lease from now (`Take`, `Renew`), in µs.
    pub lease_us: u64,
    /// The policy's `limit` now (it may have been lowered below what is held).
    pub limit: u64,
    /// `Take`: the store's time (µs) after which the take must grant nothing, because its
    /// sender no longer waits for the answer; `None` for no deadline.
    pub deadline_us: Option<u64>,
}

/// The answer to one lease call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseAnswer {
    /// `Take`: granted. `Renew`: the lease was live, and now expires `expires_in_us` from now.
    /// `Release`: the lease was live (and is no more). `Look`: `cost` would fit.
    pub ok: bool,
    /// Units held by live leases after the call.
    pub in_use: u64,
    /// `Take` or `Renew` that succeeded: the lease's expiry, from now. Otherwise 0.
    pub expires_in_us: u64,
    /// `Take` denied, or `Look` that would be: the time until the earliest live lease expires,
    /// the earliest a slot frees by itself (a release may free one sooner; a renewal, a larger
    /// cost or a lowered limit may need more). Otherwise 0.
    pub retry_after_us: u64,
    /// Leases of the policy, any subject's, that this call found expired and dropped from the
    /// ledger (holders that died or forgot): each expiry is counted by one call only. `Look`
    /// drops nothing.
    pub expired: u64,
    /// Live leases of the whole policy after the call, every subject's (the ledger's size).
    pub leases: u64,
    /// The decision's time, µs.
    pub at_us: u64,
}

impl LeaseAnswer {
    /// Nothing granted, held, waited for or dropped, decided at `at_us`.
    pub const fn at(at_us: u64) -> Self {
        Self {
            ok: false,
            in_use: 0,
            expires_in_us: 0,
            retry_after_us: 0,
            expired: 0,
            leases: 0,
            at_us,
        }
    }
}

/// One subject's leases: member string to `(expiry µs, cost)`, live or expired but not dropped
/// yet.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct State {
    pub leases: BTreeMap<String, (u64, u64)>,
}

impl LeaseCall<'_> {
    /// A sweep of a policy's ledger: it names no lease, cost or limit.
    pub const SWEEP: LeaseCall<'static> = LeaseCall {
        op: LeaseOp::Sweep,
        member: "",
        cost: 0,
        lease_us: 0,
        limit: 0,
        deadline_us: None,
    };

    /// What makes this call one that the stores must not make, if anything: a member that is
    /// not `<32 lowercase hex>:<cost>` (except for `Look`, `Sweep` and `Reset`, which name
    /// none), a `Take` whose
    /// member names another cost than the call's, a cost of 0 or above [`MAX_LIMIT`]
    /// (`Take`, `Look`), a lease of 0 or longer than [`MAX_LEASE_MS`] (`Take`, `Renew`), or a
    /// limit above [`MAX_LIMIT`]. The script reads a lease's cost from its member, so the two
    /// must agree; the bounds keep every value exact in Lua.
    pub fn problem(&self) -> Option<&'static str> {
        let member = member_cost(self.member);
        match self.op {
            LeaseOp::Look | LeaseOp::Sweep | LeaseOp::Reset => {}
            _ if member.is_none() => return Some("the member is not <32 lowercase hex>:<cost>"),
            LeaseOp::Take if member != Some(self.cost) => {
                return Some("the member names another cost than the call's")
            }
            _ => {}
        }
        if matches!(self.op, LeaseOp::Take | LeaseOp::Look) && !(1..=MAX_LIMIT).contains(&self.cost)
        {
            return Some("the cost is not within 1..=10000");
        }
        if matches!(self.op, LeaseOp::Take | LeaseOp::Renew)
            && !(1..=MAX_LEASE_MS * 1_000).contains(&self.lease_us)
        {
            return Some("the lease is not within 1 µs..=1 day");
        }
        if self.limit > MAX_LIMIT {
            return Some("the limit is above 10000");
        }
        None
    }
}

/// The cost a member string names, if it is one: `<32 lowercase hex>:<cost>`, the cost a
/// decimal number from 1 up without leading zeros (so that each lease has one spelling).
pub fn member_cost(member: &str) -> Option<u64> {
    let (id, cost) = member.split_once(':')?;
    let id_ok = id.len() == 32 && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    let cost_ok = !cost.is_empty()
        && !cost.starts_with('0')
        && cost.len() <= 19
        && cost.bytes().all(|b| b.is_ascii_digit());
    if id_ok && cost_ok {
        cost.parse().ok()
    } else {
        None
    }
}

/// A concurrency policy's live leases, every subject's, by expiry (see the module doc). A lease
/// is named by its member string alone: its 128 random bits make it unique in the policy.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ledger {
    by_expiry: BTreeSet<(u64, String)>,
    expiry_of: HashMap<String, u64>,
}

impl Ledger {
    /// Drops the leases whose expiry is at or before `now` and says how many.
    pub fn sweep(&mut self, now: u64) -> u64 {
        let mut dropped = 0;
        while self.by_expiry.first().is_some_and(|(e, _)| *e <= now) {
            if let Some((_, member)) = self.by_expiry.pop_first() {
                self.expiry_of.remove(&member);
                dropped += 1;
            }
        }
        dropped
    }

    /// Records `member` as expiring at `expiry`, replacing its previous expiry.
    pub fn set(&mut self, member: &str, expiry: u64) {
        if let Some(old) = self.expiry_of.insert(member.to_owned(), expiry) {
            self.by_expiry.remove(&(old, member.to_owned()));
        }
        self.by_expiry.insert((expiry, member.to_owned()));
    }

    /// Forgets `member`.
    pub fn remove(&mut self, member: &str) {
        if let Some(old) = self.expiry_of.remove(member) {
            self.by_expiry.remove(&(old, member.to_owned()));
        }
    }

    /// Leases held, live or expired but not swept yet.
    pub fn len(&self) -> u64 {
        self.expiry_of.len() as u64
    }

    pub fn is_empty(&self) -> bool {
        self.expiry_of.is_empty()
    }

    /// Leases live at `now` (expiry after it), reading only.
    pub fn live(&self, now: u64) -> u64 {
        let expired = self.by_expiry.iter().take_while(|(e, _)| *e <= now).count();
        self.len() - expired as u64
    }

    /// The latest expiry, if any lease is held: the ledger's key expires [`LEDGER_GRACE_MS`]
    /// after it.
    pub fn last(&self) -> Option<u64> {
        self.by_expiry.last().map(|(e, _)| *e)
    }

    /// Every lease and its expiry, earliest first.
    pub fn entries(&self) -> impl Iterator<Item = (&str, u64)> + '_ {
        self.by_expiry.iter().map(|(e, m)| (m.as_str(), *e))
    }
}

/// Decides one lease call on a subject's leases at `now_us` (see the module doc for the rules),
/// keeping the policy's `ledger` in step: what to keep (`None`: no leases left, the key is
/// deleted), the answer, and the key's new expiry from now (`Some(ttl)`: when its last lease
/// would expire; `None`: unchanged, because the call changed nothing or kept nothing). A `Sweep`
/// touches only the ledger (see [`sweep`]).
pub fn decide(
    state: Option<State>,
    ledger: &mut Ledger,
    call: &LeaseCall<'_>,
    now_us: u64,
) -> (Option<State>, LeaseAnswer, Option<u64>) {
    match call.op {
        LeaseOp::Look => {
            let answer = look(state.as_ref(), ledger, call, now_us);
            return (state.filter(|s| !s.leases.is_empty()), answer, None);
        }
        LeaseOp::Sweep => {
            return (
                state.filter(|s| !s.leases.is_empty()),
                sweep(ledger, now_us),
                None,
            );
        }
        LeaseOp::Take | LeaseOp::Renew | LeaseOp::Release | LeaseOp::Reset => {}
    }
    let now = now_us;
    let mut state = state.unwrap_or_default();
    let before = state.leases.len();
    state.leases.retain(|_, (expiry, _)| *expiry > now);
    let mut changed = state.leases.len() < before;
    let mut in_use: u64 = state.leases.values().map(|(_, cost)| cost).sum();
    let mut answer = LeaseAnswer {
        expired: ledger.sweep(now),
        ..LeaseAnswer::at(now)
    };
    let expiry = now.saturating_add(call.lease_us);
    let late = call.op == LeaseOp::Take && call.deadline_us.is_some_and(|d| now > d);
    match call.op {
        LeaseOp::Take | LeaseOp::Renew if !late => {
            if let Some(lease) = state.leases.get_mut(call.member) {
                lease.0 = expiry;
                answer.ok = true;
            } else if call.op == LeaseOp::Take && in_use.saturating_add(call.cost) <= call.limit {
                state
                    .leases
                    .insert(call.member.to_owned(), (expiry, call.cost));
                in_use += call.cost;
                answer.ok = true;
            } else if call.op == LeaseOp::Take {
                answer.retry_after_us = earliest_wait(&state, now);
            }
            if answer.ok {
                ledger.set(call.member, expiry);
                answer.expires_in_us = call.lease_us;
                changed = true;
            }
        }
        LeaseOp::Release => {
            if let Some((_, cost)) = state.leases.remove(call.member) {
                ledger.remove(call.member);
                in_use -= cost;
                answer.ok = true;
                changed = true;
            }
        }
        LeaseOp::Reset => {
            // Only the live ones: an expired member's ledger entry has been swept already.
            for member in state.leases.keys() {
                ledger.remove(member);
            }
            answer.ok = !state.leases.is_empty();
            answer.leases = ledger.len();
            return (None, answer, None);
        }
        LeaseOp::Take | LeaseOp::Renew | LeaseOp::Look | LeaseOp::Sweep => {}
    }
    answer.in_use = in_use;
    answer.leases = ledger.len();
    let last = state.leases.values().map(|(expiry, _)| *expiry).max();
    match last {
        None => (None, answer, None),
        Some(last) => (Some(state), answer, changed.then(|| last - now)),
    }
}

/// A `Look`: whether `cost` would fit among the subject's live leases now, and the policy's
/// live leases, reading only.
pub fn look(
    state: Option<&State>,
    ledger: &Ledger,
    call: &LeaseCall<'_>,
    now_us: u64,
) -> LeaseAnswer {
    let mut answer = LeaseAnswer {
        leases: ledger.live(now_us),
        ..LeaseAnswer::at(now_us)
    };
    if let Some(state) = state {
        answer.in_use = state
            .leases
            .values()
            .filter(|(expiry, _)| *expiry > now_us)
            .map(|(_, cost)| cost)
            .sum();
    }
    answer.ok = answer.in_use.saturating_add(call.cost) <= call.limit;
    if !answer.ok {
        answer.retry_after_us = state.map_or(0, |s| earliest_wait(s, now_us));
    }
    answer
}

/// A `Sweep`: the ledger's expired leases dropped and counted (`expired`), and the live ones
/// left (`leases`); every other field is 0.
pub fn sweep(ledger: &mut Ledger, now_us: u64) -> LeaseAnswer {
    let expired = ledger.sweep(now_us);
    LeaseAnswer {
        expired,
        leases: ledger.len(),
        ..LeaseAnswer::at(now_us)
    }
}

/// The time from `now` until the earliest live lease expires; 0 when none is live.
fn earliest_wait(state: &State, now: u64) -> u64 {
    state
        .leases
        .values()
        .map(|(expiry, _)| *expiry)
        .filter(|expiry| *expiry > now)
        .min()
        .map_or(0, |expiry| expiry - now)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: u64 = 1_000_000;

    fn member(n: u8, cost: u64) -> String {
        format!("{:032x}:{cost}", n)
    }

    fn call(op: LeaseOp, member: &str, cost: u64, limit: u64) -> LeaseCall<'_> {
        LeaseCall {
            op,
            member,
            cost,
            lease_us: 10 * SECOND,
            limit,
            deadline_us: None,
        }
    }

    /// Runs calls in order on one subject, each at its time; returns the answers and the TTLs.
    fn run(calls: &[(LeaseCall<'_>, u64)]) -> (Vec<LeaseAnswer>, Vec<Option<u64>>, Option<State>) {
        let mut state = None;
        let mut ledger = Ledger::default();
        let mut answers = Vec::new();
        let mut ttls = Vec::new();
        for (c, now) in calls {
            let (next, answer, ttl) = decide(state, &mut ledger, c, *now);
            state = next;
            answers.push(answer);
            ttls.push(ttl);
        }
        (answers, ttls, state)
    }

    #[test]
    fn takes_are_granted_while_their_costs_fit_the_limit() {
        let (a, b, c) = (member(1, 2), member(2, 1), member(3, 1));
        let (answers, ttls, state) = run(&[
            (call(LeaseOp::Take, &a, 2, 3), 0),
            (call(LeaseOp::Take, &b, 1, 3), SECOND),
            (call(LeaseOp::Take, &c, 1, 3), 2 * SECOND),
        ]);
        assert!(answers[0].ok && answers[1].ok && !answers[2].ok);
        assert_eq!(answers[1].in_use, 3);
        assert_eq!(answers[1].expires_in_us, 10 * SECOND);
        // The earliest lease, a's, expires at 10 s.
        assert_eq!(answers[2].retry_after_us, 8 * SECOND);
        assert_eq!(answers[2].expires_in_us, 0);
        assert_eq!(answers[2].at_us, 2 * SECOND);
        // The key expires with the last lease; a denial changes nothing.
        assert_eq!(ttls, [Some(10 * SECOND), Some(10 * SECOND), None]);
        assert_eq!(state.map(|s| s.leases.len()), Some(2));
    }

    #[test]
    fn a_live_member_taken_again_is_renewed_and_counted_once() {
        let a = member(1, 2);
        let (answers, ttls, state) = run(&[
            (call(LeaseOp::Take, &a, 2, 2), 0),
            (call(LeaseOp::Take, &a, 2, 2), 4 * SECOND),
        ]);
        assert!(answers[1].ok);
        assert_eq!(answers[1].in_use, 2);
        assert_eq!(ttls[1], Some(10 * SECOND));
        assert_eq!(state.expect("kept").leases[&a], (14 * SECOND, 2));
    }

    #[test]
    fn expired_leases_are_dropped_counted_and_free_their_units() {
        let (a, b) = (member(1, 1), member(2, 1));
        let (answers, _, state) = run(&[
            (call(LeaseOp::Take, &a, 1, 1), 0),
            // At exactly its expiry the lease is expired.
            (call(LeaseOp::Take, &b, 1, 1), 10 * SECOND),
        ]);
        assert!(answers[1].ok);
        assert_eq!(answers[1].expired, 1);
        assert_eq!(answers[1].in_use, 1);
        let leases = state.expect("kept").leases;
        assert!(leases.contains_key(&b) && !leases.contains_key(&a));
    }

    #[test]
    fn renewing_needs_a_live_lease() {
        let a = member(1, 1);
        let (answers, ttls, state) = run(&[
            (call(LeaseOp::Take, &a, 1, 1), 0),
            (call(LeaseOp::Renew, &a, 0, 1), 9 * SECOND),
            (call(LeaseOp::Renew, &a, 0, 1), 30 * SECOND),
            (call(LeaseOp::Renew, &member(2, 1), 0, 1), 30 * SECOND),
        ]);
        assert!(answers[1].ok);
        assert_eq!(answers[1].expires_in_us, 10 * SECOND);
        assert_eq!(ttls[1], Some(10 * SECOND));
        // Expired at 19 s: dropped, counted, not renewed, and the key goes with it.
        assert!(!answers[2].ok);
        assert_eq!((answers[2].expired, answers[2].in_use), (1, 0));
        assert_eq!(ttls[2], None);
        assert!(!answers[3].ok);
        assert_eq!(state, None);
    }

    #[test]
    fn a_renewal_may_shorten_a_lease_and_the_key_follows_the_latest() {
        let (a, b) = (member(1, 1), member(2, 1));
        let long = LeaseCall {
            lease_us: 60 * SECOND,
            ..call(LeaseOp::Take, &a, 1, 5)
        };
        let (_, ttls, _) = run(&[
            (long, 0),
            (call(LeaseOp::Take, &b, 1, 5), 0),
            (call(LeaseOp::Renew, &a, 0, 5), SECOND),
        ]);
        assert_eq!(
            ttls,
            [Some(60 * SECOND), Some(60 * SECOND), Some(10 * SECOND)]
        );
    }

    #[test]
    fn release_says_whether_the_lease_was_live_and_the_last_deletes_the_key() {
        let (a, b) = (member(1, 1), member(2, 2));
        let (answers, ttls, state) = run(&[
            (call(LeaseOp::Take, &a, 1, 3), 0),
            (call(LeaseOp::Take, &b, 2, 3), 0),
            (call(LeaseOp::Release, &b, 0, 3), SECOND),
            (call(LeaseOp::Release, &b, 0, 3), SECOND),
            (call(LeaseOp::Release, &a, 0, 3), SECOND),
        ]);
        assert!(answers[2].ok && !answers[3].ok && answers[4].ok);
        assert_eq!(answers[2].in_use, 1);
        assert_eq!(answers[4].in_use, 0);
        assert_eq!(ttls[2], Some(9 * SECOND));
        assert_eq!(ttls[3], None);
        assert_eq!(ttls[4], None);
        assert_eq!(state, None);
    }

    #[test]
    fn look_counts_live_leases_and_drops_nothing() {
        let (a, b) = (member(1, 1), member(2, 1));
        let long = LeaseCall {
            lease_us: 60 * SECOND,
            ..call(LeaseOp::Take, &b, 1, 2)
        };
        let (_, _, state) = run(&[(call(LeaseOp::Take, &a, 1, 2), 0), (long, 0)]);
        let before = state.clone();
        let mut ledger = Ledger::default();
        ledger.set(&a, 10 * SECOND);
        ledger.set(&b, 60 * SECOND);
        let (kept, answer, ttl) = decide(
            state,
            &mut ledger,
            &call(LeaseOp::Look, "", 2, 2),
            20 * SECOND,
        );
        assert_eq!(kept, before);
        assert_eq!(ttl, None);
        assert!(!answer.ok);
        assert_eq!((answer.in_use, answer.expired, answer.leases), (1, 0, 1));
        assert_eq!(ledger.len(), 2, "a look sweeps nothing");
        assert_eq!(answer.retry_after_us, 40 * SECOND);
        let fits = decide(
            kept,
            &mut ledger,
            &call(LeaseOp::Look, "", 1, 2),
            20 * SECOND,
        )
        .1;
        assert!(fits.ok);
        assert_eq!(fits.retry_after_us, 0);
    }

    #[test]
    fn a_lowered_limit_denies_until_enough_is_released() {
        let (a, b, c) = (member(1, 1), member(2, 1), member(3, 1));
        let (answers, _, _) = run(&[
            (call(LeaseOp::Take, &a, 1, 3), 0),
            (call(LeaseOp::Take, &b, 1, 3), 0),
            (call(LeaseOp::Take, &c, 1, 1), SECOND),
            (call(LeaseOp::Renew, &a, 0, 1), SECOND),
            (call(LeaseOp::Release, &a, 0, 1), SECOND),
            (call(LeaseOp::Take, &c, 1, 1), SECOND),
            (call(LeaseOp::Release, &b, 0, 1), SECOND),
            (call(LeaseOp::Take, &c, 1, 1), SECOND),
        ]);
        let oks: Vec<bool> = answers.iter().map(|a| a.ok).collect();
        assert_eq!(oks, [true, true, false, true, true, false, true, true]);
    }

    #[test]
    fn a_cost_above_the_limit_with_nothing_held_waits_for_nothing() {
        let (kept, answer, ttl) = decide(
            None,
            &mut Ledger::default(),
            &call(LeaseOp::Take, &member(1, 3), 3, 2),
            5,
        );
        assert_eq!((kept, ttl), (None, None));
        assert!(!answer.ok);
        assert_eq!(answer.retry_after_us, 0);
    }

    #[test]
    fn time_that_steps_back_keeps_leases_live_and_measures_from_the_new_now() {
        let a = member(1, 1);
        let (answers, ttls, _) = run(&[
            (call(LeaseOp::Take, &a, 1, 1), 10 * SECOND),
            (call(LeaseOp::Take, &member(2, 1), 1, 1), 5 * SECOND),
        ]);
        assert!(!answers[1].ok);
        assert_eq!(answers[1].retry_after_us, 15 * SECOND);
        assert_eq!(ttls[1], None);
    }

    #[test]
    fn the_ledger_counts_each_expiry_once_whichever_subject_or_sweep_finds_it() {
        let mut ledger = Ledger::default();
        let (a, b, c) = (member(1, 1), member(2, 1), member(3, 2));
        fn take(m: &str, cost: u64, lease_us: u64) -> LeaseCall<'_> {
            LeaseCall {
                lease_us,
                ..call(LeaseOp::Take, m, cost, 5)
            }
        }
        // Two subjects: x holds a (1 s) and b (3 s), y holds c (2 s).
        let (x, first, _) = decide(None, &mut ledger, &take(&a, 1, SECOND), 0);
        let (x, _, _) = decide(x, &mut ledger, &take(&b, 1, 3 * SECOND), 0);
        let (y, last, _) = decide(None, &mut ledger, &take(&c, 2, 2 * SECOND), 0);
        assert_eq!((first.leases, last.leases), (1, 3));
        // At 1.5 s a look still reads a's expiry without dropping it: 2 live of 3 held.
        let peeked = decide(
            x.clone(),
            &mut ledger,
            &call(LeaseOp::Look, "", 1, 5),
            1_500_000,
        )
        .1;
        assert_eq!((peeked.leases, peeked.expired, ledger.len()), (2, 0, 3));
        // y's call at 1.5 s counts a, which is x's: the policy's expiries, not the subject's.
        let (y, answer, _) = decide(y, &mut ledger, &call(LeaseOp::Renew, &c, 0, 5), 1_500_000);
        assert!(answer.ok);
        assert_eq!((answer.expired, answer.leases), (1, 2));
        // x's next call finds a expired in its own leases, but it was counted already.
        let (x, answer, _) = decide(x, &mut ledger, &call(LeaseOp::Renew, &b, 0, 5), 1_600_000);
        assert_eq!((answer.ok, answer.expired, answer.in_use), (true, 0, 1));
        // Nobody calls again: a sweep after both leases' ends counts them, once.
        assert_eq!(ledger.last(), Some(11_600_000));
        let swept = sweep(&mut ledger, 20 * SECOND);
        assert_eq!((swept.expired, swept.leases), (2, 0));
        assert_eq!(sweep(&mut ledger, 30 * SECOND).expired, 0);
        assert!(ledger.is_empty() && x.is_some() && y.is_some());
    }

    #[test]
    fn a_released_lease_leaves_the_ledger_and_never_counts_as_expired() {
        let mut ledger = Ledger::default();
        let a = member(1, 1);
        let (x, _, _) = decide(None, &mut ledger, &call(LeaseOp::Take, &a, 1, 2), 0);
        let (x, answer, _) = decide(x, &mut ledger, &call(LeaseOp::Release, &a, 0, 2), SECOND);
        assert_eq!((answer.ok, answer.leases, x), (true, 0, None));
        assert_eq!(sweep(&mut ledger, 60 * SECOND).expired, 0);
        // A denied take and a refused renewal leave it as it was.
        let full = LeaseCall {
            limit: 0,
            ..call(LeaseOp::Take, &a, 1, 0)
        };
        decide(None, &mut ledger, &full, 0);
        decide(None, &mut ledger, &call(LeaseOp::Renew, &a, 0, 2), 0);
        assert!(ledger.is_empty());
    }

    #[test]
    fn a_reset_ends_every_lease_of_its_subject_and_only_those() {
        let mut ledger = Ledger::default();
        let (a, b, c) = (member(1, 1), member(2, 2), member(3, 1));
        let (x, _, _) = decide(None, &mut ledger, &call(LeaseOp::Take, &a, 1, 5), 0);
        let (x, _, _) = decide(x, &mut ledger, &call(LeaseOp::Take, &b, 2, 5), 0);
        let (y, _, _) = decide(None, &mut ledger, &call(LeaseOp::Take, &c, 1, 5), 0);
        let (x, answer, ttl) = decide(x, &mut ledger, &call(LeaseOp::Reset, "", 0, 5), SECOND);
        assert_eq!((x, ttl), (None, None));
        assert_eq!((answer.ok, answer.in_use, answer.leases), (true, 0, 1));
        // The other subject's lease is untouched, and the reset ones are unknown: no renewal,
        // no expiry counted later.
        let (_, renewed, _) = decide(None, &mut ledger, &call(LeaseOp::Renew, &a, 0, 5), SECOND);
        assert!(!renewed.ok);
        assert!(
            decide(y, &mut ledger, &call(LeaseOp::Renew, &c, 0, 5), SECOND)
                .1
                .ok
        );
        assert_eq!(sweep(&mut ledger, 60 * SECOND).expired, 1);
        let nothing = decide(None, &mut ledger, &call(LeaseOp::Reset, "", 0, 5), 0).1;
        assert!(!nothing.ok);
    }

    #[test]
    fn a_take_decided_after_its_deadline_grants_nothing() {
        let mut ledger = Ledger::default();
        let a = member(1, 1);
        let late = LeaseCall {
            deadline_us: Some(SECOND),
            ..call(LeaseOp::Take, &a, 1, 5)
        };
        let (kept, answer, ttl) = decide(None, &mut ledger, &late, SECOND + 1);
        assert_eq!((kept, ttl), (None, None));
        assert_eq!(
            (answer.ok, answer.retry_after_us, answer.leases),
            (false, 0, 0)
        );
        // At its deadline it is still in time.
        assert!(decide(None, &mut ledger, &late, SECOND).1.ok);
    }

    #[test]
    fn members_have_one_spelling_and_a_take_s_names_its_cost() {
        let hex = "0123456789abcdef0123456789abcdef";
        assert_eq!(member_cost(&format!("{hex}:12")), Some(12));
        for bad in [
            format!("{hex}:012"),
            format!("{hex}:0"),
            format!("{hex}:+1"),
            format!("{hex}:"),
            format!("{}:1", hex.to_uppercase()),
            format!("{}:1", &hex[1..]),
            hex.to_owned(),
            "in_use".to_owned(),
        ] {
            assert_eq!(member_cost(&bad), None, "{bad}");
        }
        let m = format!("{hex}:2");
        assert_eq!(call(LeaseOp::Take, &m, 2, 5).problem(), None);
        assert!(call(LeaseOp::Take, &m, 1, 5).problem().is_some());
        assert_eq!(call(LeaseOp::Release, &m, 0, 5).problem(), None);
        assert!(call(LeaseOp::Renew, "x", 0, 5).problem().is_some());
        assert_eq!(call(LeaseOp::Look, "", 3, 5).problem(), None);
        assert!(call(LeaseOp::Look, "", 0, 5).problem().is_some());
        let forever = LeaseCall {
            lease_us: MAX_LEASE_MS * 1_000 + 1,
            ..call(LeaseOp::Renew, &m, 0, 5)
        };
        assert!(forever.problem().is_some());
    }
}
