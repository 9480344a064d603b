//! Connecting to the admin socket without waiting for ever. A process that stops taking
//! connections (stopped, hung) lets the socket's queue of pending ones fill, and a blocking
//! `connect` then waits until it takes one; this one gives up at a deadline.

use std::io::ErrorKind;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

/// How often a full queue is tried again: the kernel gives no signal when it has room.
const RETRY: Duration = Duration::from_millis(10);

/// Connects to the socket at `path`, failing with [`ErrorKind::TimedOut`] when no room is made
/// for the connection within `timeout`; any other failure is `connect`'s own.
pub(crate) fn connect(path: &Path, timeout: Duration) -> std::io::Result<UnixStream> {
    let (address, length) = address(path)?;
    let stream = socket()?;
    stream.set_nonblocking(true)?;
    let deadline = Instant::now() + timeout;
    loop {
        // SAFETY: `address` is a valid sockaddr_un of which `length` bytes are used.
        let status = unsafe {
            libc::connect(stream.as_raw_fd(), (&address as *const libc::sockaddr_un).cast(), length)
        };
        if status == 0 {
            break;
        }
        let error = std::io::Error::last_os_error();
        match error.raw_os_error() {
            Some(libc::EISCONN) => break,
            Some(libc::EINTR) => {}
            // A full queue (Linux), or a connection under way (the BSDs): try again.
            Some(libc::EAGAIN | libc::EINPROGRESS | libc::EALREADY) => {
                if Instant::now() >= deadline {
                    return Err(ErrorKind::TimedOut.into());
                }
                std::thread::sleep(RETRY);
            }
            _ => return Err(error),
        }
    }
    stream.set_nonblocking(false)?;
    Ok(stream)
}

/// The socket address of `path`, and how many of its bytes are used.
fn address(path: &Path) -> std::io::Result<(libc::sockaddr_un, libc::socklen_t)> {
    let bytes = path.as_os_str().as_bytes();
    // SAFETY: sockaddr_un is plain data, for which all zeroes is a valid value.
    let mut address: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    // One byte is left for the terminating zero.
    if bytes.len() >= address.sun_path.len() || bytes.contains(&0) {
        return Err(std::io::Error::new(
            ErrorKind::InvalidInput,
            format!("{} cannot be the path of a Unix socket", path.display()),
        ));
    }
    address.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (to, from) in address.sun_path.iter_mut().zip(bytes) {
        *to = *from as libc::c_char;
    }
    let start = address.sun_path.as_ptr() as usize - (&address as *const _ as usize);
    let length = libc::socklen_t::try_from(start + bytes.len() + 1).expect("a small address");
    Ok((address, length))
}

/// A new stream socket, closed on exec as std's are.
fn socket() -> std::io::Result<UnixStream> {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    let kind = libc::SOCK_STREAM | libc::SOCK_CLOEXEC;
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    let kind = libc::SOCK_STREAM;
    // SAFETY: socket has no preconditions.
    let fd = unsafe { libc::socket(libc::AF_UNIX, kind, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is a new socket that nothing else owns.
    let stream = unsafe { UnixStream::from_raw_fd(fd) };
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    // SAFETY: `fd` is open; FD_CLOEXEC is the only descriptor flag.
    if unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(stream)
}
