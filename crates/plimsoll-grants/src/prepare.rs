//! One granted run's preparation, shared by the providers that offer grants: the clients
//! written where the run's programs can read them, the run's relay opened, and the
//! variables that name both. What the provider then does with the variables (a `RunEnv`, a
//! sandboxd request) stays with it; this module knows nothing of runners.
//!
//! Nothing of the run has started while this runs: every error here means nothing ran.

use std::path::{Path, PathBuf};

use plimsoll_core::pb;

use crate::{client, env_names, Relay, RunGrant};

/// Why a granted run could not be prepared. Nothing ran.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PrepareError {
    /// The private directory for the clients could not be made.
    #[error("cannot make a private directory for the grant clients under {}: {source}", .parent.display())]
    Dir {
        /// Where it was to be made.
        parent: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The clients could not be written.
    #[error("cannot write the grant clients in {}: {source}", .dir.display())]
    Clients {
        /// The directory.
        dir: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The relay could not be opened.
    #[error("cannot open the grant relay at {at}: {source}")]
    Relay {
        /// The socket path, or `loopback`.
        at: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The relay's socket could not be opened to the run's user.
    #[error("cannot open {} to the run's user: {source}", .socket.display())]
    Socket {
        /// The socket.
        socket: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// A granted run's relay and the variables its programs get. [`Prepared::close`] ends the
/// grant when the run ends.
#[derive(Debug)]
pub struct Prepared {
    relay: Relay,
    vars: Vec<(String, String)>,
    /// A directory this preparation made (removed by `close`).
    made: Option<PathBuf>,
}

impl Prepared {
    /// The variables the run's programs get: the relay's (its address and the run's
    /// secret, never the credential), and [`env_names::JS`] / [`env_names::PY`] naming the
    /// clients, all as the programs see them.
    pub fn vars(&self) -> &[(String, String)] {
        &self.vars
    }

    /// The directory this preparation made for the clients (the loopback form), if any: a
    /// provider whose runs have a user of their own hands it to that user.
    pub fn made_dir(&self) -> Option<&Path> {
        self.made.as_deref()
    }

    /// Closes the relay and removes the directory the preparation made, if any.
    pub async fn close(self) {
        self.relay.close().await;
        if let Some(dir) = self.made {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// For programs on the host (the process provider): the clients in a fresh private
/// directory (0700, a random name) under `parent`, the relay on a loopback port, host paths.
pub async fn loopback(grant: &RunGrant, parent: &Path) -> Result<Prepared, PrepareError> {
    let dir = private_dir(parent).map_err(|source| PrepareError::Dir {
        parent: parent.to_owned(),
        source,
    })?;
    let prepared = async {
        let files = write_clients(&dir)?;
        let relay = grant
            .open_loopback()
            .await
            .map_err(|source| PrepareError::Relay {
                at: "loopback".into(),
                source,
            })?;
        let path = |p: &Path| p.to_string_lossy().into_owned();
        let vars = with_clients(relay.env(), path(&files.js), path(&files.py));
        Ok(Prepared {
            relay,
            vars,
            made: Some(dir.clone()),
        })
    }
    .await;
    if prepared.is_err() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    prepared
}

/// For programs behind a wall that sees the host directory `dir` (which must exist) at
/// `seen_at` (the Docker provider's run directory): the clients in `dir`, the relay on the
/// Unix socket `dir/socket_name`, opened to every user (the wall's user is not the
/// daemon's; `dir` itself decides who can reach it), and paths as seen from inside.
pub async fn unix_socket(
    grant: &RunGrant,
    dir: &Path,
    socket_name: &str,
    seen_at: &str,
) -> Result<Prepared, PrepareError> {
    use std::os::unix::fs::PermissionsExt;
    let files = write_clients(dir)?;
    let sock = dir.join(socket_name);
    let relay = grant
        .open_unix(&sock)
        .await
        .map_err(|source| PrepareError::Relay {
            at: sock.display().to_string(),
            source,
        })?;
    // Connecting to a Unix socket needs write permission on it.
    if let Err(source) = std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o666)) {
        relay.close().await;
        return Err(PrepareError::Socket {
            socket: sock,
            source,
        });
    }
    let inside = |p: &Path| {
        let name = p
            .file_name()
            .map(|n| n.to_string_lossy())
            .unwrap_or_default();
        format!("{seen_at}/{name}")
    };
    let socket_inside = inside(&sock);
    let relay_vars = relay
        .env()
        .into_iter()
        .map(|(k, v)| {
            if k == env_names::SOCKET {
                (k, socket_inside.clone())
            } else {
                (k, v)
            }
        })
        .collect();
    let vars = with_clients(relay_vars, inside(&files.js), inside(&files.py));
    Ok(Prepared {
        relay,
        vars,
        made: None,
    })
}

/// Gives a granted project the clients at the top of its working directory: each one is
/// added unless the project brings a file of that name itself.
pub fn add_clients(project: &mut pb::ProjectRun) {
    for (name, text) in [(client::JS_NAME, client::JS), (client::PY_NAME, client::PY)] {
        if !project.files.iter().any(|f| f.path == name) {
            project.files.push(pb::ProjectFile {
                path: name.into(),
                content: text.into(),
            });
        }
    }
}

fn write_clients(dir: &Path) -> Result<client::Files, PrepareError> {
    client::write(dir).map_err(|source| PrepareError::Clients {
        dir: dir.to_owned(),
        source,
    })
}

fn with_clients(mut vars: Vec<(String, String)>, js: String, py: String) -> Vec<(String, String)> {
    vars.push((env_names::JS.into(), js));
    vars.push((env_names::PY.into(), py));
    vars
}

/// A fresh private directory (0700) under `parent` (made if missing).
fn private_dir(parent: &Path) -> std::io::Result<PathBuf> {
    use rand::RngCore;
    use std::os::unix::fs::DirBuilderExt;
    std::fs::create_dir_all(parent)?;
    let mut b = [0u8; 16];
    rand::rngs::OsRng.fill_bytes(&mut b);
    let dir = parent.join(format!("g-{}", hex::encode(b)));
    std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_project_keeps_its_own_files_of_the_clients_names() {
        let mut p = pb::ProjectRun {
            files: vec![pb::ProjectFile {
                path: client::PY_NAME.into(),
                content: "mine".into(),
            }],
            ..Default::default()
        };
        add_clients(&mut p);
        let files: Vec<(&str, &str)> = p
            .files
            .iter()
            .map(|f| (f.path.as_str(), f.content.as_str()))
            .collect();
        assert_eq!(
            files,
            [(client::PY_NAME, "mine"), (client::JS_NAME, client::JS)]
        );
    }

    #[test]
    fn private_dirs_are_fresh_and_0700() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let parent = tmp.path().join("grants");
        let a = private_dir(&parent).unwrap();
        let b = private_dir(&parent).unwrap();
        assert_ne!(a, b);
        let mode = std::fs::metadata(&a).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
    }

    fn grant(dir: &Path) -> RunGrant {
        let file = r#"{"version":1,"profiles":{"p":{"base_url":"http://127.0.0.1:9",
            "routes":["GET /x"],"allowed_callers":["c"],"credential":{"env":"K"}}}}"#;
        let lookup = |_: &str| Some("key-never-in-vars".to_owned());
        crate::Grants::from_bytes(file.as_bytes(), dir, &lookup)
            .unwrap()
            .grant("p", "c")
            .unwrap()
    }

    fn var<'a>(p: &'a Prepared, name: &str) -> &'a str {
        p.vars()
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
            .unwrap_or_else(|| panic!("{name} missing from {:?}", p.vars()))
    }

    #[tokio::test]
    async fn loopback_writes_the_clients_in_a_private_dir_it_removes_at_close() {
        let tmp = tempfile::tempdir().unwrap();
        let p = loopback(&grant(tmp.path()), &tmp.path().join("grants"))
            .await
            .unwrap();
        let js = PathBuf::from(var(&p, env_names::JS));
        assert_eq!(std::fs::read_to_string(&js).unwrap(), client::JS);
        assert!(Path::new(var(&p, env_names::PY)).is_file());
        assert!(var(&p, env_names::URL).starts_with("http://127.0.0.1:"));
        assert!(!p
            .vars()
            .iter()
            .any(|(_, v)| v.contains("key-never-in-vars")));
        p.close().await;
        assert!(!js.parent().unwrap().exists());
    }

    #[tokio::test]
    async fn a_unix_socket_is_named_by_its_path_inside_the_wall() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let p = unix_socket(&grant(tmp.path()), tmp.path(), "g.sock", "/run/w")
            .await
            .unwrap();
        assert_eq!(var(&p, env_names::SOCKET), "/run/w/g.sock");
        assert_eq!(
            var(&p, env_names::JS),
            format!("/run/w/{}", client::JS_NAME)
        );
        assert_eq!(
            var(&p, env_names::PY),
            format!("/run/w/{}", client::PY_NAME)
        );
        let mode = std::fs::metadata(tmp.path().join("g.sock"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o666);
        p.close().await;
        assert!(
            tmp.path().is_dir(),
            "the wall's directory is its owner's to remove"
        );
    }
}
