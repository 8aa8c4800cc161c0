//! `--node ADDR`: every VM command through a node daemon's control plane, `--vm ID`
//! through its data plane, and `node info|drain|uncordon|rm-template`.
//!
//! The address is `--node` or `SANDBOXD_ADDR` (`HOST:PORT` as seed 000 writes it, or
//! `http(s)://HOST:PORT`, `https://...?ca=PEM`); `node ...` without one talks to
//! `127.0.0.1:7777`, seed 000's default. The token is `--token`, else
//! `SANDBOXD_TOKEN`, else the operator token file of this machine's node
//! (`$SANDBOX_HOME/sandboxd/token`) when it is readable.

use anyhow::{bail, Context};
use sandbox_protocol::Command as Cmd;
use sandbox_vmm::client::{AgentUrl, Client, ConnectOptions};
use sandbox_vmm::node_api::wire::{ClaimBody, ClaimReply};
use sandbox_vmm::node_api::NodeApi;

use crate::args::{NetMode, NodeCommand, VmBootArgs, VmCommand};
use crate::exec;
use crate::output::{self, print_json_line};
use crate::run::{process_spec, seconds};

/// Where `node ...` goes without `--node` or `SANDBOXD_ADDR` (seed 000's default).
pub const DEFAULT_NODE: &str = "127.0.0.1:7777";

/// The node at `addr` with the token the caller gave or this machine's operator's.
pub(crate) fn api(addr: &str, token: Option<String>) -> anyhow::Result<NodeApi> {
    let token = token
        .or_else(|| std::env::var("SANDBOXD_TOKEN").ok())
        .filter(|token| !token.trim().is_empty())
        .or_else(local_operator_token);
    NodeApi::new(addr, token).with_context(|| format!("Invalid node address {addr:?}"))
}

/// The operator token of a node run by this user on this machine, if readable.
fn local_operator_token() -> Option<String> {
    let home = sandbox_vmm::launcher::LauncherConfig::from_env().ok()?.home;
    let text = std::fs::read_to_string(home.root().join("sandboxd").join("token")).ok()?;
    Some(text.trim().to_owned()).filter(|token| !token.is_empty())
}

/// The data plane of sandbox `id`, and the options to dial it with.
pub(crate) fn agent(api: &NodeApi, id: &str) -> (AgentUrl, Option<String>) {
    (api.agent_url(id), api.token().map(str::to_owned))
}

/// `node ...`
pub(crate) async fn node(command: &NodeCommand, api: &NodeApi) -> anyhow::Result<u8> {
    match command {
        NodeCommand::Info(args) => {
            let info = api.info().await.context("node info failed")?;
            if args.json {
                print_json_line(&info)?;
                return Ok(0);
            }
            let mut text = format!(
                "node {} (sandboxd {}){}\n",
                info.addr,
                info.version,
                if info.draining { ", draining" } else { "" }
            );
            text.push_str(&format!(
                "capacity: {} VMs of {}, {} claimed, {} more claimable\n",
                info.capacity.vms,
                info.capacity.max_sandboxes,
                info.capacity.live_claims,
                info.capacity.claimable
            ));
            match &info.pool {
                Some(pool) => text.push_str(&format!(
                    "warm pool: {} ({}) {}/{} warm, {} booting{}\n",
                    pool.template,
                    pool.size,
                    pool.warm,
                    pool.target,
                    pool.booting,
                    pool.last_error
                        .as_deref()
                        .map(|error| format!("; last boot failed: {error}"))
                        .unwrap_or_default()
                )),
                None => text.push_str("warm pool: none\n"),
            }
            for template in &info.templates {
                text.push_str(&format!(
                    "template {}{}{}{}\n",
                    template.name,
                    if template.default { " (default)" } else { "" },
                    if template.promoted { " (promoted)" } else { "" },
                    template
                        .error
                        .as_deref()
                        .map(|error| format!(": {error}"))
                        .unwrap_or_default()
                ));
            }
            output::print(&text)?;
            Ok(0)
        }
        NodeCommand::Drain(args) => {
            let reply = api
                .drain(args.hibernate)
                .await
                .context("node drain failed")?;
            let mut text = format!(
                "draining: new claims are refused; {} claimed sandboxes run out here\n",
                reply.live_claims
            );
            for id in &reply.parked {
                text.push_str(&format!(
                    "{id}: handed to the fleet, wakes on another node\n"
                ));
            }
            for stayed in &reply.not_parked {
                text.push_str(&format!("{}: stays here: {}\n", stayed.id, stayed.error));
            }
            output::print(&text)?;
            Ok(if reply.not_parked.is_empty() { 0 } else { 1 })
        }
        NodeCommand::Uncordon => {
            api.uncordon().await.context("node uncordon failed")?;
            output::print("claims are taken again\n")?;
            Ok(0)
        }
        NodeCommand::RmTemplate(args) => {
            let done = api
                .delete_template(&args.name)
                .await
                .with_context(|| format!("Cannot delete the template {:?}", args.name))?;
            output::print(&format!(
                "deleted {} ({} bytes freed)\n",
                done.template, done.freed_bytes
            ))?;
            Ok(0)
        }
        NodeCommand::Publish(args) => {
            let done = api
                .publish_template(&args.name)
                .await
                .with_context(|| format!("Cannot publish the template {:?}", args.name))?;
            output::print(&format!(
                "published {}: {} bytes of data, {} sent in {} ms\n",
                done.template, done.data_bytes, done.uploaded_bytes, done.upload_ms
            ))?;
            Ok(0)
        }
        NodeCommand::StoreGc(args) => {
            let report = api
                .store_gc(args.grace, args.dry_run)
                .await
                .context("Cannot collect the store's garbage")?;
            let n = |key: &str| report[key].as_u64().unwrap_or(0);
            output::print(&format!(
                "{} manifests, {} blobs ({} named, {} young): {} {} ({} bytes)\n",
                n("manifests"),
                n("blobs"),
                n("referenced"),
                n("young"),
                if args.dry_run {
                    "would delete"
                } else {
                    "deleted"
                },
                n("deleted"),
                n("deleted_bytes")
            ))?;
            Ok(0)
        }
    }
}

/// `vm ...` through the node.
pub(crate) async fn vm(command: &VmCommand, api: &NodeApi) -> anyhow::Result<u8> {
    match command {
        VmCommand::Start(args) => {
            let claimed = claim(api, args).await?;
            print_claims(std::slice::from_ref(&claimed), false)?;
            // In a fleet the claim may have landed on another node: its calls go there.
            let owner = owner_of(api, &claimed);
            eprintln!(
                "sandboxctl: {} claimed until {}; its token is shown once, above \
                 (sandboxctl --node {} --vm {} --token TOKEN exec ...)",
                claimed.id,
                claimed.deadline,
                owner.base(),
                claimed.id
            );
            Ok(0)
        }
        VmCommand::Run(args) => {
            let claimed = claim(api, &args.boot).await?;
            let owner = owner_of(api, &claimed);
            let result = async {
                let client = connect(&owner, &claimed).await?;
                let spec = process_spec(Cmd::Argv(args.command.clone()), args.process.clone());
                exec::exec(&client, spec, &args.run).await
            }
            .await;
            if let Err(error) = owner.release(&claimed.id).await {
                tracing::warn!(sandbox = %claimed.id, %error, "release after vm run failed");
            }
            result
        }
        VmCommand::Ls(args) => {
            let rows = api
                .sandboxes()
                .await
                .context("Cannot list the node's sandboxes")?;
            if args.json {
                print_json_line(&rows)?;
                return Ok(0);
            }
            let mut table = format!(
                "{:<18}{:<12}{:<14}{:<24}{:<22}LINEAGE\n",
                "ID", "STATUS", "TEMPLATE", "SIZE", "DEADLINE"
            );
            for row in rows {
                table.push_str(&format!(
                    "{:<18}{:<12}{:<14}{:<24}{:<22}{}\n",
                    row.id,
                    row.status,
                    row.template,
                    dash(&row.size),
                    dash(&row.deadline),
                    row.lineage
                ));
            }
            output::print(&table)?;
            Ok(0)
        }
        VmCommand::Stop(args) => {
            api.release(&args.id)
                .await
                .with_context(|| format!("Cannot release {}", args.id))?;
            Ok(0)
        }
        VmCommand::Fork(args) => {
            let count = u64::try_from(args.children.count).unwrap_or(u64::MAX);
            let forked = api
                .fork(&args.id, count, 0)
                .await
                .with_context(|| format!("Cannot fork {}", args.id))?;
            print_claims(&forked.children, args.children.json)?;
            Ok(0)
        }
        VmCommand::Branch(args) => {
            let mut children = Vec::with_capacity(args.children.count);
            for _ in 0..args.children.count.max(1) {
                match api.claim_checkpoint(&args.checkpoint, 0).await {
                    Ok(child) => children.push(child),
                    Err(error) => {
                        // All or nothing, as a local branch: release what was made.
                        for child in &children {
                            let _ = owner_of(api, child).release(&child.id).await;
                        }
                        return Err(error).with_context(|| {
                            format!("Cannot branch the checkpoint {}", args.checkpoint)
                        });
                    }
                }
            }
            print_claims(&children, args.children.json)?;
            Ok(0)
        }
        VmCommand::Checkpoint(args) => {
            let taken = api
                .checkpoint(&args.id, args.name.as_deref())
                .await
                .with_context(|| format!("Cannot checkpoint {}", args.id))?;
            if args.json {
                print_json_line(&taken)?;
            } else {
                output::print(&format!("{}\n", taken.checkpoint.id))?;
            }
            Ok(0)
        }
        VmCommand::Checkpoints(args) => {
            let rows = api
                .checkpoints()
                .await
                .context("Cannot list the checkpoints")?;
            if args.json {
                print_json_line(&rows)?;
                return Ok(0);
            }
            let mut table = format!(
                "{:<24}{:<16}{:<18}{:<12}IN USE BY\n",
                "ID", "NAME", "SANDBOX", "MIB"
            );
            for row in rows {
                table.push_str(&format!(
                    "{:<24}{:<16}{:<18}{:<12}{}\n",
                    row.id,
                    dash(&row.name),
                    row.sandbox_id,
                    row.bytes_on_disk / (1024 * 1024),
                    if row.in_use_by.is_empty() {
                        "-".to_owned()
                    } else {
                        row.in_use_by.join(", ")
                    }
                ));
            }
            output::print(&table)?;
            Ok(0)
        }
        VmCommand::RmCheckpoint(args) => {
            api.delete_checkpoint(&args.checkpoint)
                .await
                .with_context(|| format!("Cannot delete the checkpoint {}", args.checkpoint))?;
            Ok(0)
        }
        VmCommand::Hibernate(args) => {
            let done = api
                .hibernate(&args.id)
                .await
                .with_context(|| format!("Cannot hibernate {}", args.id))?;
            output::print(&format!(
                "{} hibernated ({} MiB on disk)\n",
                done.id,
                done.bytes_on_disk / (1024 * 1024)
            ))?;
            Ok(0)
        }
        VmCommand::Wake(args) => {
            // The node wakes a hibernated sandbox for whatever reaches its agent.
            let (url, token) = agent(api, &args.id);
            let options = ConnectOptions {
                token,
                ..ConnectOptions::default()
            };
            let client = Client::connect(&url, &options)
                .await
                .with_context(|| format!("Cannot wake {}", args.id))?;
            client
                .info()
                .await
                .with_context(|| format!("{} did not answer after waking", args.id))?;
            Ok(0)
        }
        VmCommand::Promote(args) => {
            let done = api
                .promote(&args.id, &args.name)
                .await
                .with_context(|| format!("Cannot promote {}", args.id))?;
            output::print(&format!("{}\n", done.key.template))?;
            Ok(0)
        }
        VmCommand::EgressLog(_) => {
            bail!("vm egress-log reads the node's own files: run it on the node (without --node)")
        }
    }
}

/// A claim of what `args` describes. `default` (the flag's default) is the node's
/// default template.
async fn claim(api: &NodeApi, args: &VmBootArgs) -> anyhow::Result<ClaimReply> {
    if args.cold || args.transport.is_some() {
        bail!(
            "--cold and --transport choose how this machine boots a VM; a node decides for its own"
        );
    }
    let body = ClaimBody {
        template: if args.template == "default" {
            String::new()
        } else {
            args.template.clone()
        },
        size: args.size.clone().unwrap_or_default(),
        net: match args.net {
            NetMode::None => String::new(),
            NetMode::Egress => "egress".to_owned(),
        },
        allow: args.allow.clone(),
        ttl_seconds: args.ttl.unwrap_or(0),
        ..ClaimBody::default()
    };
    let api = api
        .clone()
        .with_timeout(seconds("--boot-timeout", args.boot_timeout)?);
    api.claim(&body)
        .await
        .with_context(|| format!("The node at {} refused the claim", api.base()))
}

/// The node that made `claimed` (its `owner_addr`), or `api`'s when that address is
/// unusable (said on stderr): a claim already made is still released.
fn owner_of(api: &NodeApi, claimed: &ClaimReply) -> NodeApi {
    api.at(&claimed.owner_addr).unwrap_or_else(|error| {
        eprintln!(
            "sandboxctl: {} names its node as {:?}, which cannot be used ({error}); going on with {}",
            claimed.id,
            claimed.owner_addr,
            api.base()
        );
        api.clone()
    })
}

async fn connect(api: &NodeApi, claimed: &ClaimReply) -> anyhow::Result<Client> {
    let options = ConnectOptions {
        token: Some(claimed.token.clone()),
        ..ConnectOptions::default()
    };
    Client::connect(&api.agent_url(&claimed.id), &options)
        .await
        .with_context(|| format!("Cannot reach the agent of {}", claimed.id))
}

/// Claims as `ID<TAB>TOKEN<TAB>DEADLINE` lines, or one JSON array.
fn print_claims(claims: &[ClaimReply], json: bool) -> anyhow::Result<()> {
    if json {
        print_json_line(&claims)?;
        return Ok(());
    }
    let text: String = claims
        .iter()
        .map(|claim| format!("{}\t{}\t{}\n", claim.id, claim.token, claim.deadline))
        .collect();
    output::print(&text)?;
    Ok(())
}

fn dash(text: &str) -> &str {
    if text.is_empty() {
        "-"
    } else {
        text
    }
}
