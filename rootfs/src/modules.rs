//! Which kernel modules the agent needs, in load order, from `modules.dep`.
//!
//! `modules.dep` (written by `depmod`) lists each module with all it depends on,
//! transitively. [`ModuleIndex::load_order`] visits a module's own dependencies
//! before the module itself, so every module comes after what it needs. Modules
//! built into the kernel (`modules.builtin`) need nothing.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// Modules every template needs: virtio transports, the vsock transport the agent
/// listens on, and the virtio console.
pub const AGENT_MODULES: [&str; 4] = [
    "virtio_mmio",
    "virtio_pci",
    "vmw_vsock_virtio_transport",
    "virtio_console",
];

/// Modules a template with a root disk needs as well.
pub const DISK_MODULES: [&str; 2] = ["virtio_blk", "ext4"];

/// A module could not be resolved.
#[derive(Debug, thiserror::Error)]
pub enum ModuleError {
    /// A modules index file could not be read.
    #[error("Cannot read {}", path.display())]
    Read {
        /// The index file.
        path: PathBuf,
        /// Why.
        #[source]
        error: io::Error,
    },
    /// The kernel has the module neither as a file nor built in.
    #[error("Kernel module {name} is neither in modules.dep nor built in")]
    Unknown {
        /// The module name.
        name: String,
    },
    /// `modules.dep` has a dependency cycle.
    #[error("Kernel module dependency cycle through {name}")]
    Cycle {
        /// A module on the cycle.
        name: String,
    },
}

/// The parsed `modules.dep` and `modules.builtin` of one kernel.
#[derive(Debug, Default)]
pub struct ModuleIndex {
    /// Module name → (its path relative to the modules folder, its dependencies' paths).
    modules: HashMap<String, (String, Vec<String>)>,
    /// Names of built-in modules.
    builtin: HashSet<String>,
}

impl ModuleIndex {
    /// Reads `modules.dep` and (if present) `modules.builtin` from a
    /// `/lib/modules/<version>` folder.
    pub fn load(modules_dir: &Path) -> Result<Self, ModuleError> {
        let read = |name: &str, required: bool| -> Result<String, ModuleError> {
            let path = modules_dir.join(name);
            match fs::read_to_string(&path) {
                Ok(text) => Ok(text),
                Err(error) if !required && error.kind() == io::ErrorKind::NotFound => {
                    Ok(String::new())
                }
                Err(error) => Err(ModuleError::Read { path, error }),
            }
        };
        Ok(Self::parse(
            &read("modules.dep", true)?,
            &read("modules.builtin", false)?,
        ))
    }

    /// Parses the texts of `modules.dep` and `modules.builtin`.
    pub fn parse(modules_dep: &str, modules_builtin: &str) -> Self {
        let mut modules = HashMap::new();
        for line in modules_dep.lines() {
            let Some((path, deps)) = line.split_once(':') else {
                continue;
            };
            let path = path.trim();
            if path.is_empty() {
                continue;
            }
            let deps = deps.split_whitespace().map(str::to_owned).collect();
            modules.insert(module_name(path), (path.to_owned(), deps));
        }
        let builtin = modules_builtin
            .lines()
            .map(str::trim)
            .filter(|line| !line.is_empty())
            .map(module_name)
            .collect();
        Self { modules, builtin }
    }

    /// True when the kernel has `name` built in.
    pub fn is_builtin(&self, name: &str) -> bool {
        self.builtin.contains(&normalize(name))
    }

    /// The module files (relative to the modules folder) to load for `wanted`, each
    /// after its dependencies, without duplicates. Built-in modules are skipped.
    pub fn load_order<S: AsRef<str>>(&self, wanted: &[S]) -> Result<Vec<String>, ModuleError> {
        let mut order = Vec::new();
        let mut done = HashSet::new();
        for name in wanted {
            let name = normalize(name.as_ref());
            if self.builtin.contains(&name) && !self.modules.contains_key(&name) {
                continue;
            }
            let mut visiting = HashSet::new();
            self.visit(&name, &mut visiting, &mut done, &mut order)?;
        }
        Ok(order)
    }

    fn visit(
        &self,
        name: &str,
        visiting: &mut HashSet<String>,
        done: &mut HashSet<String>,
        order: &mut Vec<String>,
    ) -> Result<(), ModuleError> {
        if done.contains(name) {
            return Ok(());
        }
        let Some((path, deps)) = self.modules.get(name) else {
            if self.builtin.contains(name) {
                return Ok(());
            }
            return Err(ModuleError::Unknown {
                name: name.to_owned(),
            });
        };
        if !visiting.insert(name.to_owned()) {
            return Err(ModuleError::Cycle {
                name: name.to_owned(),
            });
        }
        // modprobe loads the listed dependencies last-first; the order here does not
        // matter for correctness, because each dependency's own line is followed too.
        for dep in deps.iter().rev() {
            self.visit(&module_name(dep), visiting, done, order)?;
        }
        visiting.remove(name);
        done.insert(name.to_owned());
        order.push(path.clone());
        Ok(())
    }
}

/// `kernel/net/vmw_vsock/vsock.ko.xz` → `vsock`.
pub fn module_name(path: &str) -> String {
    let file = path.rsplit('/').next().unwrap_or(path);
    let stem = file.split(".ko").next().unwrap_or(file);
    normalize(stem)
}

/// Module names treat `-` and `_` alike.
fn normalize(name: &str) -> String {
    name.replace('-', "_")
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEP: &str = "\
kernel/drivers/virtio/virtio_ring.ko:
kernel/drivers/virtio/virtio.ko: kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/virtio/virtio_pci_modern_dev.ko:
kernel/drivers/virtio/virtio_pci_legacy_dev.ko:
kernel/drivers/virtio/virtio_pci.ko: kernel/drivers/virtio/virtio_pci_modern_dev.ko kernel/drivers/virtio/virtio_pci_legacy_dev.ko kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/virtio/virtio_mmio.ko: kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/char/virtio_console.ko: kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
kernel/net/vmw_vsock/vsock.ko:
kernel/net/vmw_vsock/vmw_vsock_virtio_transport_common.ko: kernel/net/vmw_vsock/vsock.ko
kernel/net/vmw_vsock/vmw_vsock_virtio_transport.ko: kernel/net/vmw_vsock/vmw_vsock_virtio_transport_common.ko kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko kernel/net/vmw_vsock/vsock.ko
kernel/drivers/block/virtio_blk.ko: kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
";
    const BUILTIN: &str = "kernel/fs/ext4/ext4.ko\nkernel/fs/jbd2/jbd2.ko\n";

    fn position(order: &[String], name: &str) -> usize {
        order
            .iter()
            .position(|path| module_name(path) == name)
            .unwrap_or_else(|| panic!("{name} missing from {order:?}"))
    }

    #[test]
    fn dependencies_come_before_their_users() {
        let index = ModuleIndex::parse(DEP, BUILTIN);
        let order = index.load_order(&AGENT_MODULES).unwrap();
        assert_eq!(order.len(), 10);
        for (user, dep) in [
            ("virtio", "virtio_ring"),
            ("virtio_pci", "virtio_pci_modern_dev"),
            ("virtio_pci", "virtio_pci_legacy_dev"),
            ("virtio_mmio", "virtio"),
            (
                "vmw_vsock_virtio_transport",
                "vmw_vsock_virtio_transport_common",
            ),
            ("vmw_vsock_virtio_transport_common", "vsock"),
            ("virtio_console", "virtio"),
        ] {
            assert!(
                position(&order, dep) < position(&order, user),
                "{dep} before {user}"
            );
        }
    }

    #[test]
    fn builtin_modules_are_skipped_and_shared_deps_listed_once() {
        let index = ModuleIndex::parse(DEP, BUILTIN);
        let order = index
            .load_order(&["virtio_blk", "ext4", "virtio_mmio"])
            .unwrap();
        assert_eq!(
            order,
            [
                "kernel/drivers/virtio/virtio_ring.ko",
                "kernel/drivers/virtio/virtio.ko",
                "kernel/drivers/block/virtio_blk.ko",
                "kernel/drivers/virtio/virtio_mmio.ko",
            ]
        );
        assert!(index.is_builtin("ext4"));
    }

    #[test]
    fn unknown_modules_and_cycles_are_errors() {
        let index = ModuleIndex::parse(DEP, "");
        assert!(matches!(
            index.load_order(&["nope"]),
            Err(ModuleError::Unknown { .. })
        ));
        let cyclic = ModuleIndex::parse("a.ko: b.ko\nb.ko: a.ko\n", "");
        assert!(matches!(
            cyclic.load_order(&["a"]),
            Err(ModuleError::Cycle { .. })
        ));
    }

    #[test]
    fn names_ignore_suffixes_and_dashes() {
        assert_eq!(module_name("kernel/a/vsock.ko.xz"), "vsock");
        assert_eq!(module_name("kernel/a/snd-pcm.ko"), "snd_pcm");
    }
}
