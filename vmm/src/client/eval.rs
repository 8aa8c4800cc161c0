//! Interpreter sessions (see [`sandbox_protocol::eval`]): `eval` runs code in a named
//! session whose state persists between calls, `close_session` ends one.

use sandbox_protocol::{CloseSessionRequest, EvalReply, EvalRequest, Reply, Request};

use super::{unexpected, Client, ClientError, RequestStream};

impl Client {
    /// Evaluates `request.code` in session `request.session`, starting the session
    /// when it does not exist. The reply comes when the code finished, or at most
    /// [`EVAL_INTERRUPT_GRACE_MS`](sandbox_protocol::eval::EVAL_INTERRUPT_GRACE_MS)
    /// after its deadline (the interpreter is interrupted, and killed if it does not
    /// come back). A dead session is `NotFound` unless `restart` is set; a session of
    /// another language is `WrongType`; a new session past
    /// [`MAX_SESSIONS`](sandbox_protocol::eval::MAX_SESSIONS) is `Busy`.
    pub async fn eval(&self, request: EvalRequest) -> Result<EvalReply, ClientError> {
        match self.request(Request::Eval(request)).await? {
            Reply::Eval(reply) => Ok(reply),
            other => Err(unexpected("eval", other)),
        }
    }

    /// Like [`Client::eval`], as a stream: dropping it (or
    /// [`RequestStream::cancel`]) interrupts the evaluation as its deadline would,
    /// and the session lives on.
    pub fn eval_stream(&self, request: EvalRequest) -> Result<RequestStream, ClientError> {
        self.stream(Request::Eval(request))
    }

    /// Ends session `name`: its interpreter and everything it started are killed (or
    /// a dead session is forgotten). `NotFound` for a name no session has.
    pub async fn close_session(&self, name: &str) -> Result<(), ClientError> {
        let request = Request::CloseSession(CloseSessionRequest {
            session: name.to_owned(),
        });
        self.expect_done("close_session", request).await
    }
}
