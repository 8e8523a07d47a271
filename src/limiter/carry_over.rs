//! Tests of a change of a limit's parameters (same algorithm), over every algorithm: a state
//! written under some parameters and decided under others answers exactly as no state once its
//! expiry has passed (live equals expired), whatever the history; and the usage spent carries
//! over, per algorithm as each module's doc says.

use proptest::prelude::*;

use super::*;

const T0: u64 = 1_764_460_800_123_457;

/// One field's value: small, at its bounds, or anywhere between.
fn value(f: &Field) -> BoxedStrategy<u64> {
    let (min, max) = (f.min, f.max);
    prop_oneof![
        3 => min..=max.min(min + 11),
        1 => Just(min),
        1 => Just(max),
        2 => min..=max,
        // Round windows and rates, where boundaries line up.
        1 => Just(1_000u64.clamp(min, max)),
    ]
    .boxed()
}

fn values(a: Algorithm) -> impl Strategy<Value = Vec<u64>> {
    a.fields().iter().map(value).collect::<Vec<_>>()
}

/// One operation: which of the parameter sets decides it, the clock's move, the operation and
/// a number from which its cost is made.
#[derive(Debug, Clone)]
struct Step {
    params: usize,
    dt_us: i64,
    op: Op,
    pick: u64,
    /// A refund with the mark of an earlier take, if there is one.
    marked: bool,
}

fn step(params: usize, back: bool) -> impl Strategy<Value = Step> {
    let dt = if back {
        prop_oneof![
            3 => 0i64..2_000,
            3 => 0i64..2_000_000,
            1 => -3_000_000i64..0,
            1 => 0i64..100_000_000_000,
        ]
        .boxed()
    } else {
        prop_oneof![3 => 0i64..2_000, 3 => 0i64..2_000_000, 1 => 0i64..100_000_000_000].boxed()
    };
    (
        0..params,
        dt,
        prop::sample::select(Op::ALL.to_vec()),
        any::<u64>(),
        any::<bool>(),
    )
        .prop_map(|(params, dt_us, op, pick, marked)| Step {
            params,
            dt_us,
            op,
            pick,
            marked,
        })
}

/// A cost for `op` under `p`: within the quota for an acquire or a peek, up to twice it for a
/// report or a refund.
fn cost(p: &Params, op: Op, pick: u64) -> u64 {
    let quota = p.quota();
    match (op, pick % 6) {
        (_, 0) => quota,
        (Op::Report | Op::Refund, 1) => 2 * quota,
        _ => 1 + pick % quota.min(5),
    }
}

/// One subject as a store keeps it, without ever expiring it: its state, the time its expiry
/// passes, and the marks of its takes.
#[derive(Debug, Default)]
struct Subject {
    state: Option<State>,
    expires_at: Option<u64>,
    marks: Vec<Mark>,
}

impl Subject {
    /// Runs `op`, checks the invariants every decision keeps, and returns its answer: the
    /// decision and the units recorded or given back.
    fn run(
        &mut self,
        p: &Params,
        op: Op,
        cost: u64,
        now: u64,
        mark: Option<Mark>,
    ) -> Result<(Decision, u64), TestCaseError> {
        let before = format!("{:?}", self.state);
        let mut states = [self.state.take()];
        let mut ttls = [None];
        let marks: Vec<Mark> = mark.into_iter().collect();
        let v = decide_op(&[*p], &mut states, &mut ttls, op, cost, now, &marks);
        let [state] = states;
        self.state = state;
        if let Some(ttl) = ttls[0] {
            self.expires_at = Some(now + ttl);
        }
        if self.state.is_none() {
            self.expires_at = None;
        }
        if op == Op::Acquire && v.allowed {
            self.marks.extend(v.marks());
        }
        let d = v.limits()[0];
        prop_assert!(
            d.remaining <= p.quota(),
            "remaining above the quota: {:?}",
            d
        );
        if op == Op::Peek || (op == Op::Acquire && !v.allowed) {
            prop_assert_eq!(&before, &format!("{:?}", self.state), "{:?} wrote", op);
            prop_assert_eq!(ttls[0], None);
        }
        if op == Op::Refund {
            prop_assert_eq!(ttls[0], None, "a refund moved the expiry");
        }
        Ok((d, v.units()[0]))
    }
}

/// Waits at the longest a reply states are capped, and so are expiries: a state whose true
/// expiry lies further (a huge bucket refilled once a month) may be dropped while it still
/// counts. Such cases are left out of the comparison.
fn capped(d: &Decision) -> bool {
    d.reset_after_us >= MAX_WAIT_US || d.retry_after_us >= MAX_WAIT_US
}

/// One case: an algorithm, three sets of its fields, a history under any of them, how far
/// past the state's expiry the future starts, and the future (its clock never stepping back).
#[derive(Debug, Clone)]
struct Case {
    algorithm: Algorithm,
    fields: Vec<Vec<u64>>,
    history: Vec<Step>,
    past: u64,
    future: Vec<Step>,
}

fn case() -> impl Strategy<Value = Case> {
    prop::sample::select(Algorithm::ALL.to_vec()).prop_flat_map(|a| {
        (
            prop::collection::vec(values(a), 3),
            prop::collection::vec(step(3, true), 1..24),
            prop_oneof![Just(0u64), 0u64..1_000, 0u64..10_000_000],
            prop::collection::vec(step(3, false), 1..12),
        )
            .prop_map(move |(fields, history, past, future)| Case {
                algorithm: a,
                fields,
                history,
                past,
                future,
            })
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    /// A history under some parameters, then, once the state's expiry has passed, operations
    /// under others (or the same): the state kept answers exactly as the state dropped.
    #[test]
    fn a_state_past_its_expiry_answers_as_none_under_any_parameters(
        Case { algorithm: a, fields, history, past, future } in case()
    ) {
        let params: Vec<Params> = fields.iter().map(|v| a.params(v)).collect();
        let mut kept = Subject::default();
        let mut now = T0;
        let mut long = false;
        for s in &history {
            now = now.saturating_add_signed(s.dt_us);
            let p = &params[s.params];
            let mark = if s.marked { kept.marks.last().copied() } else { None };
            let (d, _) = kept.run(p, s.op, cost(p, s.op, s.pick), now, mark)?;
            long |= capped(&d);
        }
        if long {
            // A capped expiry: see `capped`.
            return Ok(());
        }
        let Some(expires_at) = kept.expires_at else {
            return Ok(());
        };
        // The expiry is measured from each write's own clock, which may have stepped back.
        now = now.max(expires_at) + past;
        let mut dropped = Subject { marks: kept.marks.clone(), ..Subject::default() };
        for (i, s) in future.iter().enumerate() {
            now = now.saturating_add_signed(s.dt_us);
            let p = &params[s.params];
            let mark = if s.marked { kept.marks.last().copied() } else { None };
            let c = cost(p, s.op, s.pick);
            let live = kept.run(p, s.op, c, now, mark)?;
            let gone = dropped.run(p, s.op, c, now, mark)?;
            prop_assert_eq!(live, gone, "step {} {:?} of {} at {} under {:?}", i, s.op, c, now, p);
            if capped(&live.0) {
                break;
            }
        }
    }
}
