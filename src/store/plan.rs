//! What a store decides: a request resolved into a value.
//!
//! The service turns each request into a [`Plan`] in one place (`service::resolve`): the
//! policy, the subject, the operation with its own arguments ([`Ask`]), the limits to decide with
//! and, when a test drives time, the time. Every store decides plans ([`super::Store::decide`],
//! [`super::Store::acquire_joint`]), the Redis batcher queues them, and the fail modes answer for
//! them; a lease call is a [`LeasePlan`]. A plan borrows everything it names, so building one
//! allocates nothing.

use crate::limiter::concurrency::LeaseCall;
use crate::limiter::{Mark, Op, Params};
use crate::policy::{LimitKey, Policy};

/// One operation on a subject's rate limits, with its own arguments. `T` is what a refund's
/// ticket is at that layer: the client's text at the edge (`Ask<&str>`), and, once verified, its
/// marks and record as a store applies them (`Ask<Claim>`, in a [`Plan`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ask<T> {
    /// Takes `cost` from every limit if every limit admits it and nothing is booked ahead (the
    /// subject's queue of reservations, `limiter::reservation::decide_queued`); otherwise takes
    /// nothing.
    Acquire { cost: u64 },
    /// An acquire that accepts a wait (a reservation, `limiter::reservation`): `cost` is taken
    /// from every limit for the earliest time, no later than `max_wait_us` from now, at which
    /// every limit admits it (now, when it fits now), and the subject's queue moves to that time;
    /// otherwise nothing is taken. Its verdict's `taken_us` is that time.
    Reserve { cost: u64, max_wait_us: u64 },
    /// Answers as an acquire of `cost` would now, and writes nothing.
    Peek { cost: u64 },
    /// Takes `cost` from every limit whether or not it fits.
    Report { cost: u64 },
    /// Gives up to `cost` units back to every limit: with a ticket, at most what its take took
    /// less what was given back with it before, within its windows.
    Refund { cost: u64, ticket: Option<T> },
}

impl<T> Ask<T> {
    /// The operation, as the scripts and the pure functions index it.
    pub const fn op(&self) -> Op {
        match self {
            // A reservation is an acquire to everything but the store: counted, given a ticket and
            // refunded as one.
            Ask::Acquire { .. } | Ask::Reserve { .. } => Op::Acquire,
            Ask::Peek { .. } => Op::Peek,
            Ask::Report { .. } => Op::Report,
            Ask::Refund { .. } => Op::Refund,
        }
    }

    /// The units asked for.
    pub const fn cost(&self) -> u64 {
        match self {
            Ask::Acquire { cost }
            | Ask::Reserve { cost, .. }
            | Ask::Peek { cost }
            | Ask::Report { cost }
            | Ask::Refund { cost, .. } => *cost,
        }
    }

    /// The longest wait accepted: a reservation's; 0 for every other operation.
    pub const fn max_wait_us(&self) -> u64 {
        match self {
            Ask::Reserve { max_wait_us, .. } => *max_wait_us,
            _ => 0,
        }
    }

    /// A refund's ticket, if any.
    pub const fn ticket(&self) -> Option<&T> {
        match self {
            Ask::Refund { ticket, .. } => ticket.as_ref(),
            _ => None,
        }
    }

    /// The same operation with `cost` units.
    pub fn with_cost(self, cost: u64) -> Self {
        match self {
            Ask::Acquire { .. } => Ask::Acquire { cost },
            Ask::Reserve { max_wait_us, .. } => Ask::Reserve { cost, max_wait_us },
            Ask::Peek { .. } => Ask::Peek { cost },
            Ask::Report { .. } => Ask::Report { cost },
            Ask::Refund { ticket, .. } => Ask::Refund { cost, ticket },
        }
    }

    /// The same operation, its ticket (if any) replaced by `ticket`.
    pub fn with_ticket<U>(self, ticket: Option<U>) -> Ask<U> {
        match self {
            Ask::Acquire { cost } => Ask::Acquire { cost },
            Ask::Reserve { cost, max_wait_us } => Ask::Reserve { cost, max_wait_us },
            Ask::Peek { cost } => Ask::Peek { cost },
            Ask::Report { cost } => Ask::Report { cost },
            Ask::Refund { cost, .. } => Ask::Refund { cost, ticket },
        }
    }
}

/// A refund's ticket as a store applies it: its take's marks (one per limit), and its record of
/// the units given back with it, `id` on the subject (on Redis, a key on the subject's hash
/// tag), which the refund reads and adds to in the same atomic step: it gives back at most
/// `units` less what the record holds, and the record lives until `ends_at_us`, after which the
/// ticket gives nothing back anyway.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claim<'a> {
    pub marks: &'a [Mark],
    pub id: u64,
    pub units: u64,
    pub ends_at_us: u64,
}

/// One decision, as a store takes it: `ask` on the subject `key` of the rate policy `policy`,
/// over the limits `params`.
#[derive(Debug, Clone, Copy)]
pub struct Plan<'a> {
    pub policy: &'a Policy,
    pub key: &'a LimitKey,
    pub ask: Ask<Claim<'a>>,
    /// The limits to decide with, one per limit of the policy and in its order (their state
    /// keys are the policy's limits' names): the policy's own parameters.
    pub params: &'a [Params],
    /// The time (µs) to decide at, for tests that drive time explicitly; `None` uses the store's
    /// clock (Redis `TIME`, or the system clock for the embedded store).
    pub at_us: Option<u64>,
}

impl<'a> Plan<'a> {
    /// `ask` over the policy's own limits, at the store's time.
    pub fn new(policy: &'a Policy, key: &'a LimitKey, ask: Ask<Claim<'a>>) -> Self {
        Plan {
            policy,
            key,
            ask,
            params: policy.params(),
            at_us: None,
        }
    }

    /// An acquire of `cost` units over the policy's own limits, at the store's time.
    pub fn acquire(policy: &'a Policy, key: &'a LimitKey, cost: u64) -> Self {
        Plan::new(policy, key, Ask::Acquire { cost })
    }

    /// The same plan decided at `at_us` (`None`: the store's time).
    pub fn at(self, at_us: impl Into<Option<u64>>) -> Self {
        Plan {
            at_us: at_us.into(),
            ..self
        }
    }

    /// The operation.
    pub const fn op(&self) -> Op {
        self.ask.op()
    }

    /// The units asked for.
    pub const fn cost(&self) -> u64 {
        self.ask.cost()
    }

    /// A refund's ticket, as the store applies it.
    pub fn claim(&self) -> Option<&Claim<'a>> {
        self.ask.ticket()
    }

    /// A refund's marks, one per limit; empty without a ticket and for the other operations.
    pub fn marks(&self) -> &'a [Mark] {
        self.claim().map_or(&[][..], |c| c.marks)
    }
}

/// One lease call, as a store takes it: `call` on the subject `key` of the concurrency policy
/// `policy`.
#[derive(Debug, Clone, Copy)]
pub struct LeasePlan<'a> {
    pub policy: &'a Policy,
    pub key: &'a LimitKey,
    pub call: LeaseCall<'a>,
    /// As [`Plan::at_us`].
    pub at_us: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_ask_names_its_operation_and_keeps_its_arguments() {
        let marks = [Mark {
            at: 7,
            ..Mark::default()
        }];
        let claim = Claim {
            marks: &marks,
            id: 1,
            units: 3,
            ends_at_us: 9,
        };
        let asks: [(Ask<Claim<'_>>, Op); 6] = [
            (Ask::Acquire { cost: 2 }, Op::Acquire),
            (
                Ask::Reserve {
                    cost: 2,
                    max_wait_us: 9,
                },
                Op::Acquire,
            ),
            (Ask::Peek { cost: 2 }, Op::Peek),
            (Ask::Report { cost: 2 }, Op::Report),
            (
                Ask::Refund {
                    cost: 2,
                    ticket: None,
                },
                Op::Refund,
            ),
            (
                Ask::Refund {
                    cost: 2,
                    ticket: Some(claim),
                },
                Op::Refund,
            ),
        ];
        for (ask, op) in asks {
            assert_eq!(ask.op(), op);
            assert_eq!(ask.cost(), 2);
            assert_eq!(ask.with_cost(5).cost(), 5);
            assert_eq!(ask.with_cost(5).op(), op);
        }
        assert_eq!(asks[5].0.ticket(), Some(&claim));
        assert_eq!(asks[4].0.ticket(), None);
        assert_eq!(asks[1].0.with_cost(5).max_wait_us(), 9);
        assert_eq!(asks[0].0.max_wait_us(), 0);
        assert_eq!(Ask::<&str>::Acquire { cost: 1 }.ticket(), None);
        let edge: Ask<&str> = Ask::Refund {
            cost: 1,
            ticket: Some("t"),
        };
        assert_eq!(edge.with_ticket(Some(claim)).ticket(), Some(&claim));
    }
}
