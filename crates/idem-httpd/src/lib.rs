//! The HTTP server of `idem serve`: hyper on a Tokio listener, with the
//! limits a server reachable from a network needs.
//!
//! - **Header read timeout**: a connection has this long to deliver a
//!   complete request head, counted from its first byte (for a new
//!   connection: from the accept). A slow-loris that never finishes its
//!   headers is closed.
//! - **Idle timeout**: a keep-alive connection with no request for this long
//!   is closed, and so is one whose client takes no bytes of its answer for
//!   this long (a client that never reads would hold its slot forever).
//! - **Body read timeout**: a request body must have arrived this long after
//!   its head; past it the request is answered `408 request-timeout`.
//! - **Connection cap**: beyond it a new connection is answered `503
//!   server-busy` with `Retry-After` and closed, instead of waiting in the
//!   accept queue until the file descriptors run out.
//! - **Buffered bytes cap**: request bodies being read at once share one
//!   budget, and one peer (an IPv4 address, an IPv6 /64) holds at most its
//!   share of it; a body that would exceed either is answered `503
//!   server-busy` with `Retry-After`, so many slow large uploads cannot
//!   exhaust memory and one address cannot shut out the others. A declared
//!   `Content-Length` is checked against the route's limit before anything
//!   is reserved (`413`), then reserved whole when the route first reads
//!   the body; a chunked body is counted as it arrives.
//!
//! Every value is bounded ([`Limits::validate`]).

//!
//! [`bind`] and [`serve`] run the loop; [`Limits`] are its bounds;
//! [`RequestLine`] and [`NoteRoute`] write the request log; a handler's
//! answer carrying [`CloseWithoutAnswer`] closes the connection instead.

mod body;
mod connection;
mod limits;
mod request_log;
mod server;

pub use connection::CloseWithoutAnswer;
pub use limits::{Limits, MAX_BUFFERED_BYTES_LIMIT, MAX_CONNECTIONS_LIMIT};
pub use request_log::{NoteRoute, Noted, RequestLine};
pub use server::{bind, serve};
