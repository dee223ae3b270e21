//! `cargo xtask bench sandboxd-tls`: the terminator measured on loopback, in one run,
//! against named baselines measured in the same run:
//!
//! 1. median round trip of a trivial sandboxd call (`Health`), direct in plaintext against
//!    through the terminator (target ≤ 1.15×); and, so the figure can be set beside the
//!    tool operators would otherwise use, a small-message ping-pong to a plain TCP sink three
//!    ways in the same run: plain TCP, through the terminator, and through stunnel4 with the
//!    same certificate (stunnel offers no ALPN, so gRPC cannot run through it);
//! 2. bulk throughput through the terminator against stunnel4 set up for TLS 1.3 with the
//!    same certificate, both carrying the same bytes to the same plain TCP sink (target
//!    ≥ 1.0×);
//! 3. full handshakes per second (no resumption) against stunnel;
//! 4. the terminator's idle RSS (target ≤ 8 MiB) and memory per open connection.
//!
//! The binaries measured are the static ones `cargo xtask dist` builds (what ships). The
//! bench re-runs itself in release mode so the client side is optimised too. Every loop is
//! bounded in count and time, and only 127.0.0.1 is ever a target.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use plimsoll_sandboxd::{SandboxdClient, Token};
use plimsoll_tls::ClientTls;
use rustls_pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use plimsoll_testkit::ca::Ca;
use plimsoll_testkit::net::free_port;

use crate::dist;

const SERVER_NAME: &str = "sandboxd.plimsoll.invalid";
const TOKEN: &str = "bench-token-0123456789abcdef";
const CALLS: usize = 3000;
const BULK_BYTES: u64 = 512 * 1024 * 1024;
const BULK_ROUNDS: usize = 3;
const HANDSHAKE_SECONDS: u64 = 4;
const HANDSHAKE_CONCURRENCY: usize = 4;
const OPEN_CONNECTIONS: usize = 200;
/// One message of the ping-pong round trip: about a small gRPC call's frames.
const PING_BYTES: usize = 128;

/// `cargo xtask bench sandboxd-tls [--calls N]`.
pub fn run(args: &[&str]) -> Result<()> {
    if cfg!(debug_assertions) {
        // Measure with an optimised client: run this task again from a release build.
        eprintln!("xtask bench: re-running in release mode");
        let st = dist::cargo()
            .current_dir(dist::workspace_root())
            .args([
                "run",
                "--quiet",
                "--release",
                "-p",
                "xtask",
                "--",
                "bench",
                "sandboxd-tls",
            ])
            .args(args)
            .status()
            .context("running cargo")?;
        if !st.success() {
            bail!("release bench failed ({st})");
        }
        return Ok(());
    }
    let mut calls = CALLS;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match *a {
            "--calls" => {
                calls = it
                    .next()
                    .and_then(|v| v.parse().ok())
                    .context("--calls needs a number")?
            }
            other => bail!("unknown argument {other:?}; usage: bench sandboxd-tls [--calls N]"),
        }
    }
    let built = dist::build()?;
    let terminator = built[0].path.clone();
    let sandboxd = built[1].path.clone();
    for b in &built {
        println!(
            "static binary {}: {} bytes ({:.1} MiB)",
            b.path.display(),
            b.size,
            b.size as f64 / 1048576.0
        );
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(bench(&terminator, &sandboxd, calls))
}

struct Material {
    dir: tempfile::TempDir,
    cert_dir: PathBuf,
    ca_file: PathBuf,
    token_file: PathBuf,
}

fn material() -> Result<Material> {
    let dir = tempfile::tempdir()?;
    let ca = Ca::new("bench CA");
    let leaf = ca.leaf(&[SERVER_NAME]);
    let cert_dir = dir.path().join("sandboxd-tls");
    std::fs::create_dir_all(&cert_dir)?;
    std::fs::write(cert_dir.join("tls.crt"), &leaf.cert_pem)?;
    std::fs::write(cert_dir.join("tls.key"), &leaf.key_pem)?;
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, ca.pem())?;
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, TOKEN)?;
    Ok(Material {
        dir,
        cert_dir,
        ca_file,
        token_file,
    })
}

/// A child process whose stderr is kept, killed on drop.
struct Proc {
    child: Child,
    log: Arc<Mutex<Vec<String>>>,
}

impl Proc {
    fn spawn(mut cmd: Command) -> Result<Proc> {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().with_context(|| format!("starting {cmd:?}"))?;
        let err = child.stderr.take().expect("piped");
        let log = Arc::new(Mutex::new(Vec::new()));
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                sink.lock().unwrap_or_else(|p| p.into_inner()).push(line);
            }
        });
        Ok(Proc { child, log })
    }

    async fn wait_line(&self, needle: &str) -> Result<String> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(l) = self
                .log
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .find(|l| l.contains(needle))
            {
                return Ok(l.clone());
            }
            if Instant::now() > deadline {
                bail!(
                    "no log line with {needle:?}; log so far:\n{}",
                    self.log
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .join("\n")
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits up to 30 s until `addr` accepts; the error names `what` and holds its log.
    async fn wait_listening(&self, what: &str, addr: SocketAddr) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect(addr).await.is_err() {
            if Instant::now() > deadline {
                bail!(
                    "{what} did not listen on {addr}; log:\n{}",
                    self.log
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .join("\n")
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }

    fn rss_kib(&self) -> Result<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .context("no VmRSS line")
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn addr_after(line: &str, marker: &str) -> Result<SocketAddr> {
    let rest = &line[line.find(marker).context("marker")? + marker.len()..];
    let end = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == ':'))
        .unwrap_or(rest.len());
    Ok(rest[..end].parse()?)
}

/// Starts the terminator on 127.0.0.1 (any port) with `sandboxd` as its child and the
/// given upstream.
async fn start_terminator(
    terminator: &Path,
    sandboxd: &Path,
    m: &Material,
    upstream: SocketAddr,
) -> Result<(Proc, SocketAddr)> {
    let mut cmd = Command::new(terminator);
    cmd.args([
        "--listen-host=127.0.0.1",
        "--grpc-port=9091",
        "--log-format=text",
    ])
    .arg(format!("--token-file={}", m.token_file.display()))
    .arg(format!(
        "--root-dir={}",
        m.dir.path().join("runs").display()
    ))
    .env("RUST_LOG", "info")
    .env("PLIMSOLL_SANDBOXD_BIN", sandboxd)
    .env("PLIMSOLL_SANDBOXD_TLS_DIR", &m.cert_dir)
    .env("PLIMSOLL_SANDBOXD_TLS_LISTEN", "127.0.0.1:0")
    .env("PLIMSOLL_SANDBOXD_TLS_UPSTREAM", upstream.to_string())
    .env("PLIMSOLL_SANDBOXD_TLS_MAX_CONNECTIONS", "4096")
    .env("PLIMSOLL_SANDBOXD_TLS_MAX_HANDSHAKES", "4096");
    let p = Proc::spawn(cmd)?;
    // sandboxd logs its own "listening on" line into the same stream.
    let line = p.wait_line("forwarding TLS 1.3").await?;
    let addr = addr_after(&line, "listening on ")?;
    Ok((p, addr))
}

fn median(v: Vec<Duration>) -> Duration {
    super::stats::quantile_of(&v, 0.5)
}

async fn bench(terminator: &Path, sandboxd: &Path, calls: usize) -> Result<()> {
    let m = material()?;
    let token = Token::new(TOKEN)?;
    let tls = ClientTls::from_ca_file(&m.ca_file, SERVER_NAME)?;

    // (1) and (4): the real pair.
    let upstream: SocketAddr = format!("127.0.0.1:{}", free_port()).parse()?;
    let (term, tls_addr) = start_terminator(terminator, sandboxd, &m, upstream).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let idle_rss = term.rss_kib()?;

    let direct = SandboxdClient::connect_plain(upstream, &token).await?;
    let through = SandboxdClient::connect_tls(&tls, tls_addr, &token).await?;
    for _ in 0..200 {
        direct.health().await?;
        through.health().await?;
    }
    let (mut d_times, mut t_times) = (Vec::with_capacity(calls), Vec::with_capacity(calls));
    // Interleaved blocks, so a noisy neighbour hits both sides alike.
    let block = 250.min(calls.max(1));
    while d_times.len() < calls {
        for _ in 0..block {
            let t = Instant::now();
            direct.health().await?;
            d_times.push(t.elapsed());
        }
        for _ in 0..block {
            let t = Instant::now();
            through.health().await?;
            t_times.push(t.elapsed());
        }
    }
    let (d_med, t_med) = (median(d_times), median(t_times));
    let latency_ratio = t_med.as_secs_f64() / d_med.as_secs_f64();
    drop(direct);
    drop(through);

    // Memory per open connection: each one handshaken and carrying one call.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = term.rss_kib()?;
    let mut open = Vec::with_capacity(OPEN_CONNECTIONS);
    for _ in 0..OPEN_CONNECTIONS {
        let c = SandboxdClient::connect_tls(&tls, tls_addr, &token).await?;
        c.health().await?;
        open.push(c);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = term.rss_kib()?;
    let per_conn_kib = after.saturating_sub(before) as f64 / OPEN_CONNECTIONS as f64;
    drop(open);
    drop(term);

    // (2) and (3): both proxies in front of the same plain TCP sink.
    let sink = start_sink().await?;
    let fake_dir = m.dir.path().join("fake");
    std::fs::create_dir_all(&fake_dir)?;
    let fake = fake_dir.join("sleeping-sandboxd");
    std::fs::write(&fake, "#!/bin/sh\nexec sleep 3600\n")?;
    std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    let (term2, term2_addr) = start_terminator(terminator, &fake, &m, sink).await?;
    let stunnel = start_stunnel(&m, sink).await?;

    let client_cfg = bulk_client_config(&m.ca_file)?;
    let mut t_up = 0f64;
    let mut t_down = 0f64;
    let mut s_up = 0f64;
    let mut s_down = 0f64;
    let mut t_suite = String::new();
    let mut s_suite = String::new();
    for _ in 0..BULK_ROUNDS {
        let (up, suite) = bulk(&client_cfg, term2_addr, Direction::Up).await?;
        t_up = t_up.max(up);
        t_suite = suite;
        t_down = t_down.max(bulk(&client_cfg, term2_addr, Direction::Down).await?.0);
        if let Some((_, s_addr)) = &stunnel {
            let (up, suite) = bulk(&client_cfg, *s_addr, Direction::Up).await?;
            s_up = s_up.max(up);
            s_suite = suite;
            s_down = s_down.max(bulk(&client_cfg, *s_addr, Direction::Down).await?.0);
        }
    }
    // (1b) The same small-message round trip three ways, to the same sink: plain TCP, the
    // terminator and stunnel, each measured in blocks taking turns.
    // socat, a plain TCP relay in a process of its own, is the floor of any proxy hop: the
    // same two extra wake-ups and copies, no TLS.
    let relay = start_socat(sink).await?;
    let (mut p_direct, mut p_term, mut p_stunnel) = (Vec::new(), Vec::new(), Vec::new());
    let mut p_relay = Vec::new();
    for _ in 0..4 {
        p_direct.extend(ping_pong(&client_cfg, sink, false, calls / 4).await?);
        if let Some((_, r_addr)) = &relay {
            p_relay.extend(ping_pong(&client_cfg, *r_addr, false, calls / 4).await?);
        }
        p_term.extend(ping_pong(&client_cfg, term2_addr, true, calls / 4).await?);
        if let Some((_, s_addr)) = &stunnel {
            p_stunnel.extend(ping_pong(&client_cfg, *s_addr, true, calls / 4).await?);
        }
    }
    let p_direct = median(p_direct);
    let p_term = median(p_term);
    let p_stunnel = (!p_stunnel.is_empty()).then(|| median(p_stunnel));
    let p_relay = (!p_relay.is_empty()).then(|| median(p_relay));
    drop(relay);
    let t_hs = handshakes(&client_cfg, term2_addr).await?;
    let s_hs = match &stunnel {
        Some((_, a)) => Some(handshakes(&client_cfg, *a).await?),
        None => None,
    };
    let stunnel_rss = match &stunnel {
        Some((p, _)) => p.rss_kib().ok(),
        None => None,
    };
    drop(term2);
    drop(stunnel);

    let mib = |b: f64| b / 1048576.0;
    println!();
    println!("== plimsoll-sandboxd-tls benchmark (loopback, one run) ==");
    println!(
        "(1) Health round trip, median of {calls}: direct plaintext {:.1} µs, through the terminator {:.1} µs: ratio {:.3}× (target ≤ 1.15×) {}",
        d_med.as_secs_f64() * 1e6,
        t_med.as_secs_f64() * 1e6,
        latency_ratio,
        verdict(latency_ratio <= 1.15)
    );
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    println!(
        "(1b) {PING_BYTES}-byte ping-pong to a TCP sink, median of {}: plain TCP {:.1} µs; through the terminator {:.1} µs ({:.2}× plain){}",
        (calls / 4) * 4,
        us(p_direct),
        us(p_term),
        p_term.as_secs_f64() / p_direct.as_secs_f64(),
        match p_stunnel {
            Some(p) => format!(
                "; through stunnel {:.1} µs ({:.2}× plain); terminator/stunnel {:.2}×",
                us(p),
                p.as_secs_f64() / p_direct.as_secs_f64(),
                p_term.as_secs_f64() / p.as_secs_f64()
            ),
            None => "; stunnel4 is NOT installed, no comparison".into(),
        }
    );
    match p_relay {
        Some(p) => println!(
            "     the hop alone, through socat (plain TCP relay, no TLS): {:.1} µs ({:.2}× plain); the terminator's TLS over that hop {:+.1} µs",
            us(p),
            p.as_secs_f64() / p_direct.as_secs_f64(),
            us(p_term) - us(p)
        ),
        None => println!("     socat is NOT installed (apt-get install -y socat): the hop alone is not measured"),
    }
    match s_hs {
        Some(s_hs) => {
            let up_ratio = t_up / s_up;
            let down_ratio = t_down / s_down;
            println!(
                "(2) bulk, {} MiB, best of {BULK_ROUNDS}: client→sink terminator {:.0} MiB/s vs stunnel {:.0} MiB/s: ratio {:.2}× {}; sink→client terminator {:.0} MiB/s vs stunnel {:.0} MiB/s: ratio {:.2}× {} (target ≥ 1.0×; suites: {t_suite} / {s_suite})",
                BULK_BYTES / 1048576,
                mib(t_up),
                mib(s_up),
                up_ratio,
                verdict(up_ratio >= 1.0),
                mib(t_down),
                mib(s_down),
                down_ratio,
                verdict(down_ratio >= 1.0),
            );
            println!(
                "(3) full handshakes/s ({HANDSHAKE_CONCURRENCY} clients, {HANDSHAKE_SECONDS} s, no resumption): terminator {:.0}/s vs stunnel {:.0}/s: ratio {:.2}×",
                t_hs,
                s_hs,
                t_hs / s_hs
            );
        }
        None => {
            println!(
                "(2) bulk: terminator client→sink {:.0} MiB/s, sink→client {:.0} MiB/s; stunnel4 is NOT installed (apt-get install -y stunnel4), no ratio",
                mib(t_up),
                mib(t_down)
            );
            println!(
                "(3) full handshakes/s: terminator {:.0}/s; stunnel4 is NOT installed, no ratio",
                t_hs
            );
        }
    }
    println!(
        "(4) terminator idle RSS {:.2} MiB (target ≤ 8 MiB) {}; {:.1} KiB per open connection ({OPEN_CONNECTIONS} open, TLS + upstream socket + buffers){}",
        idle_rss as f64 / 1024.0,
        verdict(idle_rss <= 8 * 1024),
        per_conn_kib,
        match stunnel_rss {
            Some(k) => format!("; stunnel RSS after its runs {:.2} MiB", k as f64 / 1024.0),
            None => String::new(),
        }
    );
    Ok(())
}

fn verdict(ok: bool) -> &'static str {
    super::verdict(ok, super::BRACKETED)
}

/// The sink both proxies forward to. First byte: `U` read to EOF then answer the count
/// (8 bytes); `D` + 8-byte length: send that many bytes then close; `E`: echo one byte;
/// `P`: echo messages of [`PING_BYTES`] until the client closes.
async fn start_sink() -> Result<SocketAddr> {
    let l = TcpListener::bind("127.0.0.1:0").await?;
    let addr = l.local_addr()?;
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let _ = s.set_nodelay(true);
            tokio::spawn(async move {
                let mut mode = [0u8; 1];
                if s.read_exact(&mut mode).await.is_err() {
                    return;
                }
                match mode[0] {
                    b'U' => {
                        let mut buf = vec![0u8; 256 * 1024];
                        let mut total = 0u64;
                        loop {
                            match s.read(&mut buf).await {
                                Ok(0) | Err(_) => break,
                                Ok(n) => total += n as u64,
                            }
                        }
                        let _ = s.write_all(&total.to_be_bytes()).await;
                        let _ = s.shutdown().await;
                    }
                    b'D' => {
                        let mut len = [0u8; 8];
                        if s.read_exact(&mut len).await.is_err() {
                            return;
                        }
                        let mut left = u64::from_be_bytes(len);
                        let buf = vec![0x5au8; 256 * 1024];
                        while left > 0 {
                            let n = left.min(buf.len() as u64) as usize;
                            if s.write_all(&buf[..n]).await.is_err() {
                                return;
                            }
                            left -= n as u64;
                        }
                        let _ = s.shutdown().await;
                    }
                    b'E' => {
                        let _ = s.write_all(b"E").await;
                        let _ = s.shutdown().await;
                    }
                    b'P' => {
                        // Ping-pong: every message of PING_BYTES comes back as it is.
                        let mut msg = [0u8; PING_BYTES];
                        while s.read_exact(&mut msg).await.is_ok() {
                            if s.write_all(&msg).await.is_err() {
                                return;
                            }
                        }
                    }
                    _ => {}
                }
            });
        }
    });
    Ok(addr)
}

async fn start_stunnel(m: &Material, upstream: SocketAddr) -> Result<Option<(Proc, SocketAddr)>> {
    let bin = ["stunnel4", "stunnel"].into_iter().find(|b| {
        Command::new("sh")
            .args(["-c", &format!("command -v {b}")])
            .stdout(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    });
    let Some(bin) = bin else {
        eprintln!(
            "stunnel4 is not installed (apt-get install -y stunnel4); its comparisons are skipped"
        );
        return Ok(None);
    };
    let port = free_port();
    let conf = m.dir.path().join("stunnel.conf");
    std::fs::write(
        &conf,
        format!(
            "foreground = yes\npid =\ndebug = 3\n[bench]\naccept = 127.0.0.1:{port}\nconnect = {upstream}\ncert = {}\nkey = {}\nsslVersionMin = TLSv1.3\nsslVersionMax = TLSv1.3\n",
            m.cert_dir.join("tls.crt").display(),
            m.cert_dir.join("tls.key").display()
        ),
    )?;
    let mut cmd = Command::new(bin);
    cmd.arg(&conf);
    let p = Proc::spawn(cmd)?;
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse()?;
    p.wait_listening("stunnel", addr).await?;
    Ok(Some((p, addr)))
}

/// socat relaying 127.0.0.1:PORT to `upstream`, with `TCP_NODELAY` on both legs; `None`
/// when socat is not installed.
async fn start_socat(upstream: SocketAddr) -> Result<Option<(Proc, SocketAddr)>> {
    let installed = Command::new("socat")
        .arg("-V")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !installed {
        return Ok(None);
    }
    let port = free_port();
    let mut cmd = Command::new("socat");
    cmd.arg(format!(
        "TCP-LISTEN:{port},bind=127.0.0.1,reuseaddr,fork,nodelay"
    ))
    .arg(format!("TCP:{upstream},nodelay"));
    let p = Proc::spawn(cmd)?;
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse()?;
    p.wait_listening("socat", addr).await?;
    Ok(Some((p, addr)))
}

fn bulk_client_config(ca_file: &Path) -> Result<Arc<rustls::ClientConfig>> {
    // The same trust and protocol as plimsolld's client; stunnel selects no ALPN, which a
    // client may accept, so this one does not insist on h2.
    let cfg = ClientTls::from_ca_file(ca_file, SERVER_NAME)?.config();
    Ok(cfg)
}

#[derive(Clone, Copy)]
enum Direction {
    Up,
    Down,
}

async fn connect(
    cfg: &Arc<rustls::ClientConfig>,
    addr: SocketAddr,
) -> Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(addr).await?;
    tcp.set_nodelay(true)?;
    let c = tokio_rustls::TlsConnector::from(cfg.clone());
    Ok(c.connect(ServerName::try_from(SERVER_NAME)?, tcp).await?)
}

/// Bytes per second through `addr`, and the negotiated suite.
async fn bulk(
    cfg: &Arc<rustls::ClientConfig>,
    addr: SocketAddr,
    dir: Direction,
) -> Result<(f64, String)> {
    let mut s = connect(cfg, addr).await?;
    let suite = s
        .get_ref()
        .1
        .negotiated_cipher_suite()
        .map(|c| format!("{:?}", c.suite()))
        .unwrap_or_default();
    let started = Instant::now();
    match dir {
        Direction::Up => {
            s.write_all(b"U").await?;
            let buf = vec![0xa5u8; 64 * 1024];
            let mut left = BULK_BYTES;
            while left > 0 {
                let n = left.min(buf.len() as u64) as usize;
                s.write_all(&buf[..n]).await?;
                left -= n as u64;
            }
            s.shutdown().await?;
            let mut count = [0u8; 8];
            s.read_exact(&mut count).await?;
            let got = u64::from_be_bytes(count);
            if got != BULK_BYTES {
                bail!("the sink counted {got} bytes, not {BULK_BYTES}");
            }
        }
        Direction::Down => {
            s.write_all(b"D").await?;
            s.write_all(&BULK_BYTES.to_be_bytes()).await?;
            s.flush().await?;
            let mut buf = vec![0u8; 256 * 1024];
            let mut total = 0u64;
            loop {
                match s.read(&mut buf).await {
                    Ok(0) => break,
                    Ok(n) => total += n as u64,
                    // stunnel may close without close_notify once the sink is done.
                    Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
                    Err(e) => return Err(e.into()),
                }
            }
            if total != BULK_BYTES {
                bail!("received {total} bytes, not {BULK_BYTES}");
            }
        }
    }
    Ok((BULK_BYTES as f64 / started.elapsed().as_secs_f64(), suite))
}

/// Median ping-pong round trip of [`PING_BYTES`] on one connection: `tls` through a proxy,
/// or `None` for plain TCP straight to the sink. Returns the per-call times.
async fn ping_pong(
    cfg: &Arc<rustls::ClientConfig>,
    addr: SocketAddr,
    tls: bool,
    calls: usize,
) -> Result<Vec<Duration>> {
    let mut s: Box<dyn AsyncStream> = if tls {
        Box::new(connect(cfg, addr).await?)
    } else {
        let tcp = TcpStream::connect(addr).await?;
        tcp.set_nodelay(true)?;
        Box::new(tcp)
    };
    s.write_all(b"P").await?;
    let msg = [0x42u8; PING_BYTES];
    let mut back = [0u8; PING_BYTES];
    let mut times = Vec::with_capacity(calls);
    for i in 0..calls + 200 {
        let t = Instant::now();
        s.write_all(&msg).await?;
        s.flush().await?;
        s.read_exact(&mut back).await?;
        if i >= 200 {
            times.push(t.elapsed());
        }
    }
    if back != msg {
        bail!("the sink did not echo the message");
    }
    Ok(times)
}

trait AsyncStream: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> AsyncStream for T {}

/// Full handshakes per second: connect, handshake, one byte there and back, close.
async fn handshakes(cfg: &Arc<rustls::ClientConfig>, addr: SocketAddr) -> Result<f64> {
    let until = Instant::now() + Duration::from_secs(HANDSHAKE_SECONDS);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..HANDSHAKE_CONCURRENCY {
        let cfg = cfg.clone();
        tasks.push(tokio::spawn(async move {
            let mut n = 0u64;
            while Instant::now() < until {
                let mut s = connect(&cfg, addr).await?;
                s.write_all(b"E").await?;
                let mut b = [0u8; 1];
                s.read_exact(&mut b).await?;
                n += 1;
            }
            anyhow::Ok(n)
        }));
    }
    let mut total = 0u64;
    for t in tasks {
        total += t.await??;
    }
    Ok(total as f64 / started.elapsed().as_secs_f64())
}
