//! Integration tests of `idem-client` against a real hyper server on
//! 127.0.0.1:0: what is retried, with which key, for how long, and what is
//! refused before anything is sent.
#![allow(clippy::unwrap_used, missing_docs)]

mod input;
mod retries;
mod support;
