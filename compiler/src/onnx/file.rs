//! Opening the files an ONNX model names (the model, its external data, .pb tensors):
//! regular files only, checked before opening, since opening or reading a FIFO or a
//! device blocks forever or never ends. (The runtime's `kiln_runtime::file` does the
//! same for artifacts and .npy files; the importer does not depend on the runtime.)

use std::fs::File;
use std::io::{self, Read};
use std::path::Path;

fn not_regular(meta: &std::fs::Metadata) -> io::Error {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        let t = meta.file_type();
        if t.is_fifo() {
            return io::Error::new(io::ErrorKind::InvalidInput, "a FIFO (named pipe), not a regular file");
        }
        if t.is_char_device() || t.is_block_device() || t.is_socket() {
            return io::Error::new(io::ErrorKind::InvalidInput, "a device or socket, not a regular file");
        }
    }
    let what = if meta.is_dir() { "a directory, not a regular file" } else { "not a regular file" };
    io::Error::new(io::ErrorKind::InvalidInput, what)
}

/// Opens `path` if it is a regular file (links followed), checking the type before
/// opening and again on the opened file.
pub(crate) fn open_regular(path: &Path) -> io::Result<File> {
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

/// Reads a whole regular file.
pub(crate) fn read_regular(path: &Path) -> io::Result<Vec<u8>> {
    let mut file = open_regular(path)?;
    let mut bytes = Vec::with_capacity(file.metadata().map(|m| m.len() as usize).unwrap_or(0));
    file.read_to_end(&mut bytes)?;
    Ok(bytes)
}
