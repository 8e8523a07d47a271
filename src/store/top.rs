//! What a store keeps of the top offenders (see `service::top`): the contract between the
//! service, which counts decisions in bounded summaries, and Redis, where every instance folds
//! its summaries into one per policy and minute (`lua/top.lua`, `store/redis/top.rs`).
//!
//! The three dimensions a subject is counted in, in this order everywhere (the keys, the
//! script's arguments, the answer): its denied decisions, its allowed ones, and its allowed ones
//! that left it near its limit.

/// The dimensions, in the order of [`Tally`] arrays, the keys and the script's arguments.
pub const DIMENSIONS: usize = 3;

/// One dimension of a summary, as it travels between the service and the store: the decisions
/// it counted (exactly), the subjects it tracks with their counts, and its error bound (every
/// count is within `bound` of the subject's true count; a subject it does not track has at most
/// `bound`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tally {
    pub total: u64,
    pub bound: u64,
    pub entries: Vec<(String, u64)>,
}

/// Which fold this is: the folding instance's random id and its sequence number, increasing
/// over every fold that instance sends. `lua/top.lua` applies a fold only when its sequence is
/// above the last one applied from that instance to the minute, so a fold whose outcome is
/// unknown (a timeout while Redis hung) is sent again unchanged and counted once, whether the
/// first sending ran or not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FoldId {
    pub instance: u64,
    pub seq: u64,
}

/// One minute of a policy's summaries: its number (Unix time in minutes) and one tally per
/// dimension.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Minute {
    pub minute: u64,
    pub tallies: [Tally; DIMENSIONS],
}

/// How long Redis keeps a minute's summaries, in seconds: the longest window (an hour) and the
/// minute in progress, and one more for the folds of a late instance.
pub const MINUTE_TTL_S: u64 = 62 * 60;
