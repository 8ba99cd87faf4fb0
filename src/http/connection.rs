//! What a connection tells each request it carries, put on the request in
//! one place for both servers that route requests (the general HTTP server
//! in `net`, and the daemons' `http+pb` connections in `daemon`, which route
//! what is not a daemon call). The handler, the pages and the access log
//! read these back as extensions; a field one server lacked would silently
//! change what a call may do (a connection that never proves itself).

use std::net::SocketAddr;

use axum::extract::ConnectInfo;

use crate::{
    admin::ClientCertificate,
    edge::{ConnectionBudget, QueuedAnswers},
    security::OverTls,
};

/// The connection's facts, cloned into every request.
#[derive(Debug, Clone)]
pub struct ConnectionFacts {
    /// The socket's peer (a trusted proxy's client is read from the request).
    pub peer: SocketAddr,
    /// Its share of the buffered-body budget, which also carries its
    /// standing (`Proof`): a call that proves a token marks it.
    pub budget: ConnectionBudget,
    /// Its answers not yet taken by the client, where the server tracks them
    /// (HTTP/2 streams); a call waits while they exceed the bound.
    pub queued: Option<QueuedAnswers>,
    /// Whether the bytes arrived over TLS.
    pub over_tls: bool,
    /// The client certificate the TLS handshake verified, if any.
    pub certificate: Option<ClientCertificate>,
}

impl ConnectionFacts {
    /// Puts every fact on `request`.
    pub fn mark<B>(&self, request: &mut axum::http::Request<B>) {
        let extensions = request.extensions_mut();
        extensions.insert(ConnectInfo(self.peer));
        extensions.insert(self.budget.clone());
        if let Some(queued) = &self.queued {
            extensions.insert(queued.clone());
        }
        if self.over_tls {
            extensions.insert(OverTls);
        }
        if let Some(certificate) = &self.certificate {
            extensions.insert(certificate.clone());
        }
    }
}
