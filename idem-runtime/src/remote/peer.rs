//! Who is at the other end of a Unix socket. The admin socket's mode keeps other users out of
//! the file; this asks the kernel who actually connected, so a mode loosened by hand (or a socket
//! reached some other way) still lets no one else in.

use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;

/// `Ok` when the peer runs as this process's effective user, else why it was refused.
pub(crate) fn check_same_user(stream: &UnixStream) -> Result<(), String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    let peer =
        peer_uid(stream).map_err(|e| format!("cannot tell which user connected ({e}); refused"))?;
    if peer == me {
        Ok(())
    } else {
        Err(format!(
            "user {peer} may not use this store's admin socket: only its owner (user {me}) may; \
             run idem as that user"
        ))
    }
}

#[cfg(any(target_os = "linux", target_os = "android"))]
fn peer_uid(stream: &UnixStream) -> std::io::Result<libc::uid_t> {
    let mut cred = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` are valid for writes and `len` holds `cred`'s size.
    let status = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if status == 0 {
        Ok(cred.uid)
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn peer_uid(stream: &UnixStream) -> std::io::Result<libc::uid_t> {
    let mut uid: libc::uid_t = 0;
    let mut gid: libc::gid_t = 0;
    // SAFETY: `uid` and `gid` are valid for writes.
    let status = unsafe { libc::getpeereid(stream.as_raw_fd(), &mut uid, &mut gid) };
    if status == 0 {
        Ok(uid)
    } else {
        Err(std::io::Error::last_os_error())
    }
}
