//! ratelimiter: a rate-limit service any program calls over HTTP/JSON.
//!
//! The map, from the edge inwards:
//! - [`api`]: HTTP only. Routes, JSON shapes, `RateLimit` headers, the OpenAPI document, and the
//!   one place errors become `application/problem+json`.
//! - [`service`]: the policy cache in front of the store; fail modes.
//! - [`policy`]: what a policy is, its validation, the in-process cache.
//! - [`store`]: where state lives: embedded in-process, or Redis, one server or a Cluster (one Lua
//!   script per decision), with the circuit breaker in front of it.
//! - [`limiter`]: the decision of each algorithm as a pure function of (state, params, cost,
//!   now); the Lua scripts in `lua/` mirror them.
//! - [`config`], [`startup`], [`telemetry`], [`metrics`]: settings, assembling the application,
//!   logging, Prometheus metrics.
#![forbid(unsafe_code)]

pub mod api;
pub mod config;
pub mod limiter;
pub mod metrics;
pub mod policy;
pub mod service;
pub mod startup;
pub mod store;
pub mod telemetry;
