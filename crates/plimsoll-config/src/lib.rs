//! plimsoll-config: where plimsoll's settings come from. Every program and library that is
//! configured by environment variables reads them through [`EnvSource`] (the process
//! environment in production, a [`MapEnv`] in tests, so no test ever sets a variable),
//! parses them with [`Vars`], and reports a bad one as a [`ConfigError`] that names it.
//!
//! Each configured part (plimsolld's core, each provider, the pod-side terminator) keeps its
//! own table of the variables it reads ([`Variable`]); a program joins the tables it uses for
//! its `--help` and for [`unknown_variables`].
//!
//! One set of rules for every value: a value is trimmed, and unset, empty or blank means
//! "not set" (the default applies); a boolean is `1`/`true` or `0`/`false`/empty.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

/// A variable a part reads: its name and one line of help.
pub type Variable = (&'static str, &'static str);

/// A source of environment variables.
pub trait EnvSource {
    /// The value of `name`, if set.
    fn get(&self, name: &str) -> Option<String>;
    /// Every variable name that is set.
    fn names(&self) -> Vec<String>;
}

/// The real process environment.
#[derive(Debug, Default, Clone, Copy)]
pub struct ProcessEnv;

impl EnvSource for ProcessEnv {
    fn get(&self, name: &str) -> Option<String> {
        std::env::var(name).ok()
    }
    fn names(&self) -> Vec<String> {
        std::env::vars_os()
            .filter_map(|(k, _)| k.into_string().ok())
            .collect()
    }
}

/// A fixed set of variables (tests, embedded daemons).
#[derive(Debug, Default, Clone)]
pub struct MapEnv(pub BTreeMap<String, String>);

impl MapEnv {
    /// Builds a map from pairs.
    pub fn from_pairs<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Self {
        MapEnv(
            pairs
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
        )
    }
}

impl EnvSource for MapEnv {
    fn get(&self, name: &str) -> Option<String> {
        self.0.get(name).cloned()
    }
    fn names(&self) -> Vec<String> {
        self.0.keys().cloned().collect()
    }
}

/// A bad or missing setting: one line naming the variable (or file) and what to fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{name}: {message}")]
pub struct ConfigError {
    /// The variable (or file) at fault.
    pub name: String,
    /// What is wrong and what to do.
    pub message: String,
}

impl ConfigError {
    /// An error about `name`.
    pub fn new(name: impl Into<String>, message: impl Into<String>) -> ConfigError {
        ConfigError {
            name: name.into(),
            message: message.into(),
        }
    }
}

/// Reads and parses variables from one source, by the rules in the crate's documentation.
#[derive(Clone, Copy)]
pub struct Vars<'a> {
    env: &'a dyn EnvSource,
}

impl std::fmt::Debug for Vars<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Values may be credentials (a grants file names them): never print them.
        f.write_str("Vars { .. }")
    }
}

impl<'a> Vars<'a> {
    /// Reads from `env`.
    pub fn new(env: &'a dyn EnvSource) -> Vars<'a> {
        Vars { env }
    }

    /// The source itself (for a part that hands it on).
    pub fn source(&self) -> &'a dyn EnvSource {
        self.env
    }

    /// The trimmed value, or `None` when unset, empty or blank.
    pub fn string(&self, name: &str) -> Option<String> {
        self.env
            .get(name)
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
    }

    /// Whether the variable holds a value.
    pub fn is_set(&self, name: &str) -> bool {
        self.string(name).is_some()
    }

    /// A path, or `None` when not set.
    pub fn path(&self, name: &str) -> Option<PathBuf> {
        self.string(name).map(PathBuf::from)
    }

    /// A boolean: `1`/`true` on, `0`/`false`/unset off; anything else names the variable.
    pub fn bool(&self, name: &str) -> Result<bool, ConfigError> {
        parse_bool(name, self.string(name).as_deref())
    }

    /// A number, or `default` when not set.
    pub fn number<T: FromStr>(&self, name: &str, default: T) -> Result<T, ConfigError> {
        match self.string(name) {
            None => Ok(default),
            Some(v) => v
                .parse()
                .map_err(|_| ConfigError::new(name, format!("{v:?} is not a valid number"))),
        }
    }

    /// A number greater than zero, or `default` when not set.
    pub fn positive(&self, name: &str, default: usize) -> Result<usize, ConfigError> {
        match self.string(name) {
            None => Ok(default),
            Some(v) => match v.parse::<usize>() {
                Ok(n) if n > 0 => Ok(n),
                _ => Err(ConfigError::new(
                    name,
                    format!("{v:?} is not a positive number"),
                )),
            },
        }
    }

    /// A positive number of milliseconds, or `default` when not set.
    pub fn millis(&self, name: &str, default: Duration) -> Result<Duration, ConfigError> {
        match self.string(name) {
            None => Ok(default),
            Some(v) => match v.parse::<u64>() {
                Ok(ms) if ms > 0 => Ok(Duration::from_millis(ms)),
                _ => Err(ConfigError::new(
                    name,
                    format!("{v:?} is not a positive number of milliseconds"),
                )),
            },
        }
    }

    /// A `host:port` address (a name is resolved), or `default` when not set.
    pub fn address(&self, name: &str, default: &str) -> Result<SocketAddr, ConfigError> {
        parse_address(name, &self.string(name).unwrap_or_else(|| default.into()))
    }

    /// A literal `IP:port` address (nothing is resolved), or `default` when not set.
    pub fn socket_addr(&self, name: &str, default: SocketAddr) -> Result<SocketAddr, ConfigError> {
        match self.string(name) {
            None => Ok(default),
            Some(v) => v
                .parse()
                .map_err(|_| ConfigError::new(name, format!("{v:?} is not an IP:port address"))),
        }
    }

    /// A path that must name an existing regular file, or `None` when not set; `fix` says
    /// what to do when it does not.
    pub fn file(&self, name: &str, fix: &str) -> Result<Option<PathBuf>, ConfigError> {
        match self.path(name) {
            Some(p) if !p.is_file() => Err(ConfigError::new(
                name,
                format!("{} is not a file; {fix}", p.display()),
            )),
            other => Ok(other),
        }
    }
}

/// Parses a boolean the one way every plimsoll program does (`None` is off).
pub fn parse_bool(name: &str, v: Option<&str>) -> Result<bool, ConfigError> {
    match v.map(str::trim).unwrap_or("") {
        "" | "0" | "false" => Ok(false),
        "1" | "true" => Ok(true),
        other => Err(ConfigError::new(
            name,
            format!("{other:?} is not a boolean; use 1/true or 0/false/empty"),
        )),
    }
}

/// Parses a `host:port` address, resolving a name.
pub fn parse_address(name: &str, v: &str) -> Result<SocketAddr, ConfigError> {
    use std::net::ToSocketAddrs;
    v.to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| ConfigError::new(name, format!("{v:?} is not a host:port address")))
}

/// Names that start with one of `prefixes`, are set in `env`, and appear in none of
/// `tables`, sorted: a misspelt safeguard would otherwise be silently off.
pub fn unknown_variables(
    env: &dyn EnvSource,
    prefixes: &[&str],
    tables: &[&[Variable]],
) -> Vec<String> {
    let mut unknown: Vec<String> = env
        .names()
        .into_iter()
        .filter(|n| prefixes.iter().any(|p| n.starts_with(p)))
        .filter(|n| !tables.iter().any(|t| t.iter().any(|(k, _)| k == n)))
        .collect();
    unknown.sort();
    unknown
}

/// A `--help` list of the variables in `tables`, one per line, aligned.
pub fn help(tables: &[&[Variable]]) -> String {
    let all = || tables.iter().flat_map(|t| t.iter());
    let width = all().map(|(k, _)| k.len()).max().unwrap_or(0);
    all().map(|(k, v)| format!("  {k:width$}  {v}\n")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> MapEnv {
        MapEnv::from_pairs(pairs.iter().copied())
    }

    #[test]
    fn booleans() {
        for off in ["", "0", "false", " 0 "] {
            assert!(!parse_bool("X", Some(off)).unwrap());
        }
        assert!(!parse_bool("X", None).unwrap());
        for on in ["1", "true"] {
            assert!(parse_bool("X", Some(on)).unwrap());
        }
        let e = parse_bool("PLIMSOLL_HARDENED", Some("yes")).unwrap_err();
        assert_eq!(e.name, "PLIMSOLL_HARDENED");
        assert!(e.to_string().starts_with("PLIMSOLL_HARDENED: "), "{e}");
    }

    #[test]
    fn blank_is_unset_and_values_are_trimmed() {
        let env = vars(&[("A", "  "), ("B", " 7 "), ("C", "")]);
        let v = Vars::new(&env);
        assert_eq!(v.string("A"), None);
        assert_eq!(v.string("C"), None);
        assert_eq!(v.number("B", 0u32).unwrap(), 7);
        assert_eq!(v.number("A", 3u32).unwrap(), 3);
        assert!(!v.is_set("A") && v.is_set("B"));
    }

    #[test]
    fn numbers_durations_and_addresses_name_their_variable() {
        let env = vars(&[
            ("N", "many"),
            ("P", "0"),
            ("MS", "-5"),
            ("ADDR", "nowhere"),
            ("IP", "localhost:1"),
            ("OK_MS", "250"),
        ]);
        let v = Vars::new(&env);
        assert_eq!(v.number::<u32>("N", 1).unwrap_err().name, "N");
        assert_eq!(v.positive("P", 1).unwrap_err().name, "P");
        assert_eq!(v.millis("MS", Duration::ZERO).unwrap_err().name, "MS");
        assert_eq!(
            v.millis("OK_MS", Duration::ZERO).unwrap(),
            Duration::from_millis(250)
        );
        assert_eq!(v.address("ADDR", "x").unwrap_err().name, "ADDR");
        assert_eq!(
            v.address("UNSET", "127.0.0.1:8746").unwrap(),
            "127.0.0.1:8746".parse().unwrap()
        );
        // A literal address refuses a name that would need resolving.
        let any = "0.0.0.0:1".parse().unwrap();
        assert_eq!(v.socket_addr("IP", any).unwrap_err().name, "IP");
        assert_eq!(v.socket_addr("UNSET", any).unwrap(), any);
    }

    #[test]
    fn files_must_exist() {
        let env = vars(&[("F", "/nonexistent/plimsoll-config-test")]);
        let e = Vars::new(&env).file("F", "set it to a file").unwrap_err();
        assert_eq!(e.name, "F");
        assert!(e.message.contains("set it to a file"), "{e}");
        assert_eq!(Vars::new(&env).file("G", "x").unwrap(), None);
    }

    #[test]
    fn unknown_names_and_help_join_tables() {
        const A: &[Variable] = &[("PLIMSOLL_ADDR", "listen address")];
        const B: &[Variable] = &[("SANDBOX_DOCKER_IMAGE", "image")];
        let env = vars(&[
            ("PLIMSOLL_ADDR", "x"),
            ("SANDBOX_DOCKER_IMAGE", "y"),
            ("SANDBOX_DOCKER_IMAG", "typo"),
            ("HOME", "/"),
        ]);
        assert_eq!(
            unknown_variables(&env, &["PLIMSOLL_", "SANDBOX_"], &[A, B]),
            vec!["SANDBOX_DOCKER_IMAG".to_owned()]
        );
        let h = help(&[A, B]);
        assert_eq!(
            h,
            "  PLIMSOLL_ADDR         listen address\n  SANDBOX_DOCKER_IMAGE  image\n"
        );
    }
}
