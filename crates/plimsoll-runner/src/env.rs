//! The environment a run's programs start with: a fixed clean base plus checked extras.
//!
//! Nothing of the caller's (daemon's) own environment ever reaches a program.

use std::path::Path;

use crate::tree::RUN_TAG_VAR;
use crate::{EnvRefused, RunEnv};

/// The `PATH` every program starts with.
pub const FIXED_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Names the runner refuses outright, compared after ASCII upper-casing. They either choose
/// what a program loads or runs, or are fixed by the runner itself (`HOME`, `TMPDIR`,
/// `LANG`, the run tag), which also choose where interpreters look for start-up files.
pub const REFUSED_NAMES: &[&str] = &[
    // Fixed by the runner.
    "PATH",
    "HOME",
    "TMPDIR",
    "LANG",
    RUN_TAG_VAR,
    // Node.
    "NODE_OPTIONS",
    "NODE_PATH",
    "NODE_EXTRA_CA_CERTS",
    "NODE_REPL_EXTERNAL_MODULE",
    "NODE_ICU_DATA",
    // Shells.
    "BASH_ENV",
    "ENV",
    "SHELLOPTS",
    "BASHOPTS",
    "PS4",
    "IFS",
    "CDPATH",
    "PROMPT_COMMAND",
    "GLOBIGNORE",
    // glibc loading.
    "GCONV_PATH",
    "LOCPATH",
    "NLSPATH",
    "HOSTALIASES",
    "GETCONF_DIR",
    // Ruby.
    "GEM_HOME",
    "GEM_PATH",
    "BUNDLE_GEMFILE",
    // JVM.
    "JAVA_TOOL_OPTIONS",
    "_JAVA_OPTIONS",
    "JDK_JAVA_OPTIONS",
    "CLASSPATH",
    // OpenSSL loads engines and providers (shared objects) named by these.
    "OPENSSL_CONF",
    "OPENSSL_ENGINES",
    "OPENSSL_MODULES",
    // Programs other programs start.
    "EDITOR",
    "VISUAL",
    "PAGER",
    "SHELL",
    "SSH_ASKPASS",
    "GIT_EXEC_PATH",
    "GIT_SSH",
    "GIT_SSH_COMMAND",
    "GIT_ASKPASS",
    "GIT_EDITOR",
    "GIT_PAGER",
    "GIT_PROXY_COMMAND",
    "GIT_EXTERNAL_DIFF",
    "GIT_TEMPLATE_DIR",
];

/// Name prefixes the runner refuses (after ASCII upper-casing): whole families where one
/// member or another chooses code to load.
pub const REFUSED_PREFIXES: &[&str] = &[
    "LD_",         // LD_PRELOAD, LD_LIBRARY_PATH, LD_AUDIT, ...
    "DYLD_",       // the macOS loader
    "PYTHON",      // PYTHONPATH, PYTHONSTARTUP, PYTHONHOME, PYTHONBREAKPOINT, PYTHONWARNINGS...
    "PERL",        // PERL5LIB, PERL5OPT, PERLLIB, PERL5DB
    "RUBY",        // RUBYOPT, RUBYLIB
    "BASH_FUNC_",  // exported shell functions
    "NPM_CONFIG_", // npm_config_node_options, npm_config_script_shell...
    "GIT_CONFIG",  // GIT_CONFIG_GLOBAL, GIT_CONFIG_PARAMETERS, GIT_CONFIG_COUNT...
];

/// Checks one variable; `Err` carries the refused name.
pub(crate) fn check_var(name: &str, value: &str) -> Result<(), EnvRefused> {
    let refuse = || {
        Err(EnvRefused {
            name: name.to_owned(),
        })
    };
    if name.is_empty() || name.contains('=') || name.contains('\0') || value.contains('\0') {
        return refuse();
    }
    let upper = name.to_ascii_uppercase();
    if REFUSED_NAMES.iter().any(|n| upper == *n)
        || REFUSED_PREFIXES.iter().any(|p| upper.starts_with(p))
    {
        return refuse();
    }
    Ok(())
}

impl RunEnv {
    pub(crate) fn checked(vars: Vec<(String, String)>) -> Result<RunEnv, EnvRefused> {
        for (name, value) in &vars {
            check_var(name, value)?;
        }
        Ok(RunEnv(vars))
    }
}

/// The whole environment of one program: the fixed base, then the run's checked extras.
pub(crate) fn program_env(
    workdir: &Path,
    tmpdir: &Path,
    tag: &str,
    extra: &RunEnv,
) -> Vec<(String, String)> {
    let mut env = vec![
        ("PATH".to_owned(), FIXED_PATH.to_owned()),
        ("HOME".to_owned(), workdir.to_string_lossy().into_owned()),
        ("TMPDIR".to_owned(), tmpdir.to_string_lossy().into_owned()),
        ("LANG".to_owned(), "C.UTF-8".to_owned()),
        (RUN_TAG_VAR.to_owned(), tag.to_owned()),
    ];
    env.extend(extra.vars().iter().cloned());
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    // Every refused name is checked through the public `RunEnv::new` in
    // tests/runner.rs (`run_env_refuses_each_dangerous_name`); here, one of each rule.
    #[test]
    fn refuses_loaders_and_fixed_names() {
        for name in [
            "LD_PRELOAD",
            "ld_preload",
            "BASH_FUNC_ls%%",
            "HOME",
            "",
            "A=B",
        ] {
            assert_eq!(
                check_var(name, "x"),
                Err(EnvRefused {
                    name: name.to_owned()
                }),
                "{name:?}"
            );
        }
        assert!(check_var("GOOD", "a\0b").is_err());
    }

    #[test]
    fn accepts_harmless() {
        for name in [
            "PLIMSOLL_GRANT_RELAY",
            "NODE_ENV",
            "TZ",
            "MY_VAR",
            "LDAP_HOST",
        ] {
            assert_eq!(check_var(name, "value with = sign"), Ok(()), "{name}");
        }
    }

    #[test]
    fn base_then_extras() {
        let extra = RunEnv::checked(vec![("A".into(), "1".into())]).unwrap();
        let env = program_env(Path::new("/w"), Path::new("/w/.tmp"), "abc", &extra);
        assert_eq!(env[0], ("PATH".into(), FIXED_PATH.into()));
        assert!(env.contains(&("HOME".into(), "/w".into())));
        assert!(env.contains(&(RUN_TAG_VAR.into(), "abc".into())));
        assert_eq!(env.last().unwrap(), &("A".into(), "1".into()));
    }
}
