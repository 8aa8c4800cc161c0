//! One request in, one final answer out: routes each [`Request`] to its handler.

use sandbox_protocol::{Reply, Request, WireError};

use crate::agent::Agent;
use crate::events::Events;
use crate::files::stream::{blocking, PutReceiver};
use crate::files::{stream, tree, whole, FileError};
use crate::machine;
use crate::process::{exec, kill, logs, pty};
use crate::session;

/// Why a `PortForward` was refused: it turns its connection into a byte pipe, so it
/// must be the connection's first request.
pub const PORT_FORWARD_FIRST: &str =
    "port_forward must be the first and only request of its connection";

/// Runs `request` to its final reply, sending progress through `events`. `input`
/// carries the data of a `put`.
pub async fn handle(
    agent: &Agent,
    request: Request,
    events: &Events,
    input: Option<PutReceiver>,
) -> Result<Reply, WireError> {
    let table = &agent.table;
    let process = |error: crate::process::ProcessError| error.to_wire();
    let file = |error: FileError| error.to_wire();
    match request {
        Request::Exec(request) => exec::exec(table, request, events)
            .await
            .map(Reply::Exec)
            .map_err(process),
        Request::Spawn(request) => exec::spawn(table, &request.spec)
            .map(Reply::Spawned)
            .map_err(process),
        Request::Logs(request) => logs::logs(table, request, events)
            .await
            .map(Reply::Logs)
            .map_err(process),
        Request::Ps => Ok(Reply::Ps(table.list())),
        Request::Kill(request) => kill::kill(table, request)
            .map(|()| Reply::Done)
            .map_err(process),
        Request::PtyOpen(request) => pty::open(table, &request)
            .map(Reply::PtyOpened)
            .map_err(process),
        Request::PtyInput(request) => pty::input(table, request.pid, &request.data)
            .await
            .map(|()| Reply::Done)
            .map_err(process),
        Request::PtyResize(request) => pty::resize(table, request.pid, request.size)
            .map(|()| Reply::Done)
            .map_err(process),
        Request::Info => Ok(Reply::Info(agent.info())),
        Request::WriteFile(request) => blocking(move || whole::write_file(&request))
            .await
            .map(|()| Reply::Done)
            .map_err(file),
        Request::ReadFile(request) => {
            // Charged before the bytes are read (see `crate::budget`).
            let path = request.path.clone();
            let bytes = blocking(move || Ok(whole::bytes_to_read(&path)))
                .await
                .unwrap_or(0);
            events.hold(events.budget().reserve_large(bytes).await);
            blocking(move || whole::read_file(&request.path))
                .await
                .map(Reply::File)
                .map_err(file)
        }
        Request::ListDir(request) => blocking(move || tree::list_dir(&request.path))
            .await
            .map(Reply::Dir)
            .map_err(file),
        Request::Stat(request) => blocking(move || tree::stat(&request.path))
            .await
            .map(Reply::Stat)
            .map_err(file),
        Request::Mkdir(request) => blocking(move || tree::mkdir(&request))
            .await
            .map(|()| Reply::Done)
            .map_err(file),
        Request::Remove(request) => blocking(move || tree::remove(&request))
            .await
            .map(|()| Reply::Done)
            .map_err(file),
        Request::Rename(request) => blocking(move || tree::rename(&request))
            .await
            .map(|()| Reply::Done)
            .map_err(file),
        Request::Put(request) => match input {
            Some(input) => stream::put(request, input, events)
                .await
                .map(transferred)
                .map_err(file),
            None => Err(WireError::new(
                sandbox_protocol::ErrorKind::Internal,
                "put without an input queue",
            )),
        },
        Request::Get(request) => stream::get(&request.path, events)
            .await
            .map(transferred)
            .map_err(file),
        Request::Resumed(request) => machine::resumed(agent, request).await.map(Reply::Info),
        Request::Reidentify(request) => machine::reidentify(agent, request)
            .await
            .map(|()| Reply::Done),
        Request::Shutdown(request) => {
            machine::shutdown(agent, request);
            Ok(Reply::Done)
        }
        Request::PsDetail => Ok(Reply::PsDetail(table.list_detail())),
        Request::Confinement => Ok(Reply::Confinement(table.confinement().report())),
        Request::WaitForText(request) => crate::wait::wait_for_text(table, request)
            .await
            .map(Reply::TextFound)
            .map_err(|error| error.to_wire()),
        Request::Eval(request) => session::requests::eval(agent, request, events)
            .await
            .map(Reply::Eval),
        Request::CloseSession(request) => session::requests::close(agent, request)
            .await
            .map(|()| Reply::Done),
        // Taken by `connection` before dispatch when it opens its connection.
        Request::PortForward(_) => Err(WireError::new(
            sandbox_protocol::ErrorKind::BadRequest,
            PORT_FORWARD_FIRST,
        )),
    }
}

fn transferred((bytes, mode): (u64, u32)) -> Reply {
    Reply::Transferred { bytes, mode }
}
