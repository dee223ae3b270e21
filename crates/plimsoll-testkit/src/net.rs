//! Free loopback ports.

/// A TCP port free on 127.0.0.1 right now (bound, then released), below 65000 so that the
/// next port up can be used too.
pub fn free_port() -> u16 {
    loop {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        let p = l.local_addr().expect("a bound address").port();
        if p < 65_000 {
            return p;
        }
    }
}

/// [`free_port`] on 127.0.0.1, as an address.
pub fn free_addr() -> std::net::SocketAddr {
    std::net::SocketAddr::from(([127, 0, 0, 1], free_port()))
}
