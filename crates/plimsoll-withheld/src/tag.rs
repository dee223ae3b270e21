//! Error tags that let each scan component claim its own errors (see `walk`'s module doc).

use std::io;

/// An error a scan component raised about its own node: that node turns it into `reason`.
#[derive(Debug)]
pub(crate) struct Tagged {
    pub origin: u64,
    pub reason: String,
}

impl std::fmt::Display for Tagged {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (node {})", self.reason, self.origin)
    }
}
impl std::error::Error for Tagged {}

/// An error of the scan's source (engine stream, file on disk): the scan cannot go on.
#[derive(Debug)]
pub(crate) struct Fatal(pub io::Error);

impl std::fmt::Display for Fatal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}
impl std::error::Error for Fatal {}

/// An io::Error carrying a [`Tagged`].
pub(crate) fn tagged(origin: u64, reason: impl Into<String>) -> io::Error {
    io::Error::other(Tagged {
        origin,
        reason: reason.into(),
    })
}

pub(crate) fn as_tagged(e: &io::Error) -> Option<&Tagged> {
    e.get_ref().and_then(|x| x.downcast_ref::<Tagged>())
}

pub(crate) fn as_fatal(e: &io::Error) -> Option<&Fatal> {
    e.get_ref().and_then(|x| x.downcast_ref::<Fatal>())
}

/// True for errors some scan component already claimed or marked fatal.
pub(crate) fn ours(e: &io::Error) -> bool {
    as_tagged(e).is_some() || as_fatal(e).is_some()
}

/// The reason of an error tagged by `origin`, if it is that node's own.
pub(crate) fn own_reason(e: &io::Error, origin: u64) -> Option<String> {
    as_tagged(e)
        .filter(|t| t.origin == origin)
        .map(|t| t.reason.clone())
}
