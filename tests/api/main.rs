//! Black-box tests of the service over HTTP, and of the Lua scripts on a real Redis.
//!
//! One test binary (so it links once). Every test that needs Redis starts its own private
//! `redis-server` on a free loopback port (see `helpers`); none touches any other Redis.

mod certs;
mod helpers;
mod zoned;

mod acl;
mod acquire;
mod batch;
mod bounds;
mod calendar;
mod calendar_overrides;
mod carry_over;
mod claims;
mod cluster;
mod cluster_faults;
mod connections;
mod costs;
mod denial_cache;
mod edge;
mod errors;
mod faults;
mod gcra;
mod grpc;
mod grpc_hardening;
mod incarnation;
mod instances;
mod lease_hardening;
mod lease_scripts;
mod leases;
mod leases_smoke;
mod limits;
mod listener_tls;
mod metrics;
mod openapi;
mod operations;
mod outcomes;
mod overrides;
mod policies;
mod policy_sync;
mod redis_tls;
mod reservations;
mod scripts;
mod settle;
mod settling;
mod tickets;
mod top;
mod traces;
mod version;
mod waits;
