//! ratelimiter: a rate-limit service any program calls over HTTP/JSON.
//!
//! The map, from the edge inwards:
//! - [`grpc`]: Envoy's rate-limit service over gRPC, on the same policies and quotas, when
//!   `grpc.bind` is set.
//! - [`api`]: HTTP only. Routes, JSON shapes, `RateLimit` headers, the OpenAPI document, and the
//!   one place errors become `application/problem+json`.
//! - [`fields`]: the IETF `RateLimit-Policy`, `RateLimit` and `Retry-After` field values of a
//!   decision's answer, written once for `api`'s headers and `grpc`'s.
//! - [`access`]: who may do what, from a bearer token: the tokens by scope and their
//!   constant-time check, read by `api` and `grpc` alike.
//! - [`service`]: what the application does with a request: resolves it into the
//!   [`store::Plan`] a store decides (the one place a request's policy, kind, cost, ticket and
//!   the subject's override are read), decides acquires, joint acquires and leases, answers by
//!   the one fail-mode table when the store fails, and keeps the policy cache (overrides
//!   included) following the store's change log; policy and override reads and writes,
//!   readiness; the top offenders' summaries (`service::top`), counted beside each decision and
//!   folded into the store off the acquire path.
//! - [`policy`]: what a policy is (one to eight rate limits on the same subjects, with tiers, or
//!   one concurrency limit held by leases), what an override of it is, and their validation, the
//!   one reader of policy documents.
//! - [`store`]: where state lives, behind one trait that decides plans: embedded in-process
//!   (`store/memory/`), or Redis, one server or a Cluster (`store/redis/`: one Lua script per
//!   decision, composed from the parts of a policy's limits, with the circuit breaker in front of
//!   it).
//! - [`limiter`]: the decision of each algorithm as a pure function of (state, params, cost,
//!   now), the decision over several limits at once, and the registry that names each algorithm
//!   once (its fields, its Lua part); the Lua parts in `lua/` mirror the functions.
//! - [`config`], [`startup`], [`telemetry`], [`trace`], [`metrics`]: settings, assembling the
//!   application, logging, OpenTelemetry traces, Prometheus metrics.
//! - [`tls`]: TLS on the HTTP and gRPC listeners (certificates, client CA, reload, expiry).
#![forbid(unsafe_code)]

pub mod access;
pub mod api;
pub mod config;
pub mod fields;
pub mod grpc;
pub mod limiter;
pub mod metrics;
pub mod policy;
pub mod service;
pub mod startup;
pub mod store;
pub mod telemetry;
pub mod tls;
pub mod trace;
