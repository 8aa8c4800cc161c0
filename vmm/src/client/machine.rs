//! Requests about the whole guest rather than one process or file (see
//! [`sandbox_protocol::machine`]): `info`, `resumed` after a snapshot restore or a
//! fork, and `shutdown`.

use sandbox_protocol::{AgentInfo, Reply, Request, ResumedRequest, ShutdownRequest};

use super::{unexpected, Client, ClientError};

impl Client {
    /// Describes the agent.
    pub async fn info(&self) -> Result<AgentInfo, ClientError> {
        match self.request(Request::Info).await? {
            Reply::Info(info) => Ok(info),
            other => Err(unexpected("info", other)),
        }
    }

    /// Tells the guest it was restored (or forked): set its clock to `wall_clock_ns`,
    /// mix in `entropy`, and with `new_identity` write a new machine id.
    pub async fn resumed(
        &self,
        wall_clock_ns: u64,
        entropy: Vec<u8>,
        new_identity: bool,
    ) -> Result<AgentInfo, ClientError> {
        let request = ResumedRequest {
            wall_clock_ns,
            entropy,
            new_identity,
        };
        match self.request(Request::Resumed(request)).await? {
            Reply::Info(info) => Ok(info),
            other => Err(unexpected("resumed", other)),
        }
    }

    /// Asks the agent to stop every process and power the guest off (or reboot).
    pub async fn shutdown(&self, reboot: bool) -> Result<(), ClientError> {
        self.expect_done("shutdown", Request::Shutdown(ShutdownRequest { reboot }))
            .await
    }
}
