//! Integration tests: the real server on real sockets, one test binary.

mod browser;
mod daemons;
mod dashboard;
mod dialects;
mod differential;
mod edge;
mod errors;
mod fidelity;
mod fixtures;
mod flare;
mod grpc;
mod grpc_clients;
mod grpc_web;
mod long_poll;
mod openapi_contract;
mod openapi_document;
mod openapi_live;
mod openapi_schema;
mod operations;
mod operators;
mod peers;
mod protocols;
mod restart;
mod sim;
mod support;
mod wire;
