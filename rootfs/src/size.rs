//! VM sizes: vCPUs and guest memory, by preset name or custom.
//!
//! One type for the builder, which records a template's default size in
//! `template.json` (checked when the template is built, so a bad size fails the build
//! rather than a boot), and for the launcher, which boots it.
//!
//! | preset | vCPUs | memory |
//! | --- | --- | --- |
//! | `small` | 1 | 512 MiB |
//! | `medium` | 2 | 1024 MiB |
//! | `large` | 2 | 2048 MiB |
//! | `xlarge` | 4 | 4096 MiB |
//! | `2xlarge` | 8 | 8192 MiB |
//!
//! Presets mean the same on every host, so a template's default size does not change
//! with the machine it lands on. On a small host they overcommit rather than fail:
//! under TCG each vCPU is one host thread, so on 2 cores `xlarge` and `2xlarge` share
//! them (an idle vCPU halts and costs nothing; a busy guest runs slower). Guest RAM is
//! a memfd that the host fills lazily, so only pages the guest touches cost host
//! memory. A custom size is written `VCPUSxMIB`, e.g. `2x1536`.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Below this the stock cloud kernel runs out of memory while booting (64 MiB does).
pub const MIN_MEMORY_MIB: u32 = 128;

/// The most vCPUs a microvm guest gets here (no x2APIC routing is set up).
pub const MAX_VCPUS: u16 = 64;

/// The most guest memory accepted (1 TiB), to catch unit mistakes early.
pub const MAX_MEMORY_MIB: u32 = 1024 * 1024;

/// vCPUs and guest memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Size {
    /// Virtual CPUs.
    pub vcpus: u16,
    /// Guest memory in MiB.
    pub memory_mib: u32,
}

/// A size that is not a preset name, not `VCPUSxMIB`, or out of range.
#[derive(Debug, thiserror::Error)]
pub enum SizeError {
    /// Not a preset and not `VCPUSxMIB`.
    #[error("Unknown size {0:?}: use small, medium, large, xlarge, 2xlarge or VCPUSxMIB")]
    Unknown(String),
    /// Out of range.
    #[error("Size of {vcpus} vCPUs and {memory_mib} MiB is out of range (1..={max_vcpus} vCPUs, {min_mib}..={max_mib} MiB)", max_vcpus = MAX_VCPUS, min_mib = MIN_MEMORY_MIB, max_mib = MAX_MEMORY_MIB)]
    OutOfRange {
        /// Requested vCPUs.
        vcpus: u16,
        /// Requested memory.
        memory_mib: u32,
    },
}

impl Size {
    /// 1 vCPU, 512 MiB.
    pub const SMALL: Size = Size {
        vcpus: 1,
        memory_mib: 512,
    };
    /// 2 vCPUs, 1024 MiB.
    pub const MEDIUM: Size = Size {
        vcpus: 2,
        memory_mib: 1024,
    };
    /// 2 vCPUs, 2048 MiB.
    pub const LARGE: Size = Size {
        vcpus: 2,
        memory_mib: 2048,
    };
    /// 4 vCPUs, 4096 MiB.
    pub const XLARGE: Size = Size {
        vcpus: 4,
        memory_mib: 4096,
    };
    /// 8 vCPUs, 8192 MiB.
    pub const XXLARGE: Size = Size {
        vcpus: 8,
        memory_mib: 8192,
    };

    /// Every preset with its name, smallest first.
    pub const PRESETS: [(&'static str, Size); 5] = [
        ("small", Self::SMALL),
        ("medium", Self::MEDIUM),
        ("large", Self::LARGE),
        ("xlarge", Self::XLARGE),
        ("2xlarge", Self::XXLARGE),
    ];

    /// The size used when neither the caller nor the template names one.
    pub const DEFAULT: Size = Self::SMALL;

    /// A custom size, checked against the limits.
    pub fn new(vcpus: u16, memory_mib: u32) -> Result<Self, SizeError> {
        let size = Size { vcpus, memory_mib };
        size.validate()?;
        Ok(size)
    }

    /// The preset called `name`, if any.
    pub fn preset(name: &str) -> Option<Self> {
        Self::PRESETS
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, size)| *size)
    }

    /// The preset name of this size, if it is one.
    pub fn preset_name(&self) -> Option<&'static str> {
        Self::PRESETS
            .iter()
            .find(|(_, size)| size == self)
            .map(|(name, _)| *name)
    }

    /// Checks the limits (a deserialized size has not been checked).
    pub fn validate(&self) -> Result<(), SizeError> {
        let ok = (1..=MAX_VCPUS).contains(&self.vcpus)
            && (MIN_MEMORY_MIB..=MAX_MEMORY_MIB).contains(&self.memory_mib);
        if ok {
            Ok(())
        } else {
            Err(SizeError::OutOfRange {
                vcpus: self.vcpus,
                memory_mib: self.memory_mib,
            })
        }
    }
}

impl Default for Size {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl FromStr for Size {
    type Err = SizeError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        if let Some(size) = Self::preset(s) {
            return Ok(size);
        }
        let unknown = || SizeError::Unknown(s.to_owned());
        let (vcpus, mib) = s.split_once(['x', 'X']).ok_or_else(unknown)?;
        let vcpus = vcpus.parse().map_err(|_| unknown())?;
        let mib = mib.parse().map_err(|_| unknown())?;
        Self::new(vcpus, mib)
    }
}

/// Serde form of a [`Size`] as its name (`"small"`, `"3x1536"`), as `template.json`
/// writes it: `#[serde(with = "size::as_name")]`. Reading checks the limits.
pub mod as_name {
    use serde::{Deserialize, Deserializer, Serializer};

    use super::Size;

    /// Writes the preset name or `VCPUSxMIB`.
    pub fn serialize<S: Serializer>(size: &Size, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(size)
    }

    /// Parses a preset name or `VCPUSxMIB`, refusing sizes out of range.
    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Size, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

impl fmt::Display for Size {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.preset_name() {
            Some(name) => f.write_str(name),
            None => write!(f, "{}x{}", self.vcpus, self.memory_mib),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_have_the_documented_shapes() {
        let shapes: Vec<_> = Size::PRESETS
            .iter()
            .map(|(name, s)| (*name, s.vcpus, s.memory_mib))
            .collect();
        assert_eq!(
            shapes,
            [
                ("small", 1, 512),
                ("medium", 2, 1024),
                ("large", 2, 2048),
                ("xlarge", 4, 4096),
                ("2xlarge", 8, 8192),
            ]
        );
        for (_, size) in Size::PRESETS {
            size.validate().unwrap();
        }
    }

    #[test]
    fn names_and_custom_sizes_parse_and_print_back() {
        assert_eq!("2xlarge".parse::<Size>().unwrap(), Size::XXLARGE);
        assert_eq!("Medium".parse::<Size>().unwrap(), Size::MEDIUM);
        let custom: Size = "3x1536".parse().unwrap();
        assert_eq!(custom, Size::new(3, 1536).unwrap());
        assert_eq!(custom.to_string(), "3x1536");
        assert_eq!("2x1024".parse::<Size>().unwrap().to_string(), "medium");
    }

    #[test]
    fn nonsense_and_out_of_range_sizes_are_refused() {
        for bad in ["huge", "x", "2x", "0x512", "1x64", "1x-5", "65x1024"] {
            assert!(bad.parse::<Size>().is_err(), "{bad} accepted");
        }
    }
}
