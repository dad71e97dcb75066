//! Opening files whose names come from users (models, artifacts, .npy inputs): only
//! regular files. A FIFO, a socket or a character device (`/dev/zero`) would block
//! forever or never end, so they are refused before anything is read.

use std::fs::File;
use std::io;
use std::path::Path;

/// What a path that is not a regular file is, for messages.
fn file_kind(meta: &std::fs::Metadata) -> &'static str {
    let t = meta.file_type();
    if t.is_dir() {
        return "a directory";
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_fifo() {
            return "a FIFO (named pipe)";
        }
        if t.is_socket() {
            return "a socket";
        }
        if t.is_char_device() || t.is_block_device() {
            return "a device";
        }
    }
    "not a regular file"
}

/// The error for a path that is not a regular file (the caller names the path).
fn not_regular(meta: &std::fs::Metadata) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, format!("{}, not a regular file", file_kind(meta)))
}

/// Opens `path` for reading if it is a regular file (symbolic links are followed). The
/// type is checked before opening (opening a FIFO blocks) and again on the opened file.
pub fn open_regular(path: &Path) -> io::Result<File> {
    let meta = std::fs::metadata(path)?;
    if !meta.is_file() {
        return Err(not_regular(&meta));
    }
    let file = File::open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(not_regular(&meta));
    }
    Ok(file)
}

/// Reads a whole regular file ([`open_regular`]).
pub fn read_regular(path: &Path) -> io::Result<Vec<u8>> {
    use io::Read;
    let mut file = open_regular(path)?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)?;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_regular_files_open() {
        let dir = std::env::temp_dir().join(format!("kiln-file-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("a.bin");
        std::fs::write(&f, b"abc").unwrap();
        assert_eq!(read_regular(&f).unwrap(), b"abc");
        let e = open_regular(&dir).unwrap_err();
        assert!(e.to_string().contains("directory"), "{e}");
        #[cfg(unix)]
        {
            let fifo = dir.join("fifo");
            // No FIFO support (some sandboxes): nothing to test.
            if std::process::Command::new("mkfifo").arg(&fifo).status().is_ok_and(|s| s.success()) {
                let e = open_regular(&fifo).unwrap_err();
                assert!(e.to_string().contains("FIFO"), "{e}");
            }
            assert!(open_regular(Path::new("/dev/zero")).unwrap_err().to_string().contains("device"));
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
