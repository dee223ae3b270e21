//! Isolation tiers (`process` < `container` < `kernel` < `vm`) and request floors.

use std::fmt;
use std::str::FromStr;

/// How strong the wall around a run is, weakest first. The derived order is the
/// strength order, so `a >= b` means "a meets a floor of b".
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Tier {
    /// A child process of the daemon: no OS wall. For a first try, never for hostile code.
    Process,
    /// A container with the engine's default runtime (runc): shared kernel.
    Container,
    /// A user-space kernel (gVisor): the host kernel is not directly reachable.
    Kernel,
    /// A virtual machine (Kata, Firecracker).
    Vm,
}

impl Tier {
    /// Every tier, weakest first.
    pub const ALL: [Tier; 4] = [Tier::Process, Tier::Container, Tier::Kernel, Tier::Vm];

    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Process => "process",
            Tier::Container => "container",
            Tier::Kernel => "kernel",
            Tier::Vm => "vm",
        }
    }

    /// Whether this tier satisfies `floor`.
    pub fn meets(self, floor: Floor) -> bool {
        match floor.0 {
            None => true,
            Some(min) => self >= min,
        }
    }
}

impl fmt::Display for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A tier name that is not one of the four.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown isolation tier {0:?}; expected one of process, container, kernel, vm")]
pub struct UnknownTier(pub String);

impl FromStr for Tier {
    type Err = UnknownTier;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Tier::ALL
            .into_iter()
            .find(|t| t.as_str() == s)
            .ok_or_else(|| UnknownTier(s.to_owned()))
    }
}

/// The weakest tier a request (or the daemon) accepts. `Floor::NONE` accepts any tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Floor(pub Option<Tier>);

impl Floor {
    /// No floor: any tier is acceptable.
    pub const NONE: Floor = Floor(None);

    /// Parses the wire form: `""` is no floor, otherwise a tier name. `"none"` is refused
    /// on purpose: a caller who writes it almost certainly meant something else.
    pub fn parse(s: &str) -> Result<Floor, UnknownTier> {
        if s.is_empty() {
            Ok(Floor(None))
        } else {
            s.parse().map(|t| Floor(Some(t)))
        }
    }

    /// The wire form.
    pub fn as_str(self) -> &'static str {
        self.0.map_or("", Tier::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_and_meets() {
        assert!(
            Tier::Vm > Tier::Kernel
                && Tier::Kernel > Tier::Container
                && Tier::Container > Tier::Process
        );
        assert!(Tier::Process.meets(Floor::NONE));
        assert!(!Tier::Process.meets(Floor(Some(Tier::Container))));
        assert!(Tier::Kernel.meets(Floor(Some(Tier::Container))));
    }

    #[test]
    fn parse_floor() {
        assert_eq!(Floor::parse("").unwrap(), Floor::NONE);
        assert_eq!(Floor::parse("vm").unwrap(), Floor(Some(Tier::Vm)));
        assert!(Floor::parse("none").is_err());
        assert!(Floor::parse("VM").is_err());
    }
}
