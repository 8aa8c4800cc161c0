//! `info`: what the agent says about itself.

use std::fmt::Write;

use anyhow::Context;

use sandbox_vmm::client::Client;

use crate::json::InfoView;
use crate::output::{self, print_json_line};

/// Prints the agent's description as `key  value` lines or JSON.
pub(crate) async fn info(client: &Client, json: bool) -> anyhow::Result<u8> {
    let info = client.info().await.context("info failed")?;
    let confinement = client.confinement().await.context("info failed")?;
    let view = InfoView::new(&info, client.hello(), confinement.as_ref());
    if json {
        print_json_line(&view)?;
    } else {
        output::print(&human(&view))?;
    }
    Ok(0)
}

fn human(view: &InfoView<'_>) -> String {
    let mut out = String::new();
    let mut line = |key: &str, value: String| {
        let _ = writeln!(out, "{key:<16}{value}");
    };
    line("agent version", view.agent_version.to_owned());
    line("protocol", view.protocol_version.to_string());
    line("boot id", view.boot_id.to_owned());
    line("capabilities", view.capabilities.join(", "));
    line("init", if view.is_init { "yes" } else { "no" }.to_owned());
    line(
        "uptime",
        format!(
            "{:.1}s",
            std::time::Duration::from_millis(view.uptime_ms).as_secs_f64()
        ),
    );
    line("generation", view.generation.to_string());
    line(
        "load",
        format!(
            "{:.2} {:.2} {:.2}",
            view.load[0], view.load[1], view.load[2]
        ),
    );
    line(
        "memory",
        format!(
            "{} MiB available of {} MiB",
            view.mem_available_bytes >> 20,
            view.mem_total_bytes >> 20
        ),
    );
    line(
        "processes",
        format!(
            "{} running, {} exited",
            view.processes_running, view.processes_exited
        ),
    );
    if let Some(c) = &view.confinement {
        line("confinement", confinement_text(c));
    }
    out
}

/// `cgroups (workload memory.max 391 MiB, pids.max 3387)`, or `process_groups (why)`.
fn confinement_text(c: &crate::json::ConfinementView<'_>) -> String {
    let mut text = c.mode.to_owned();
    if let (Some(memory), Some(pids)) = (c.memory_max_bytes, c.pids_max) {
        let _ = write!(
            text,
            " (workload memory.max {} MiB, pids.max {pids})",
            memory >> 20
        );
    }
    if let Some(reason) = c.reason {
        let _ = write!(text, " ({reason})");
    }
    text
}
