//! plimsolld: the daemon. Reads its configuration from the environment, starts one
//! provider, and serves protocol 5. It never holds a signing key.

fn main() -> anyhow::Result<()> {
    anyhow::bail!("plimsolld is not built yet")
}
