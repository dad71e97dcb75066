//! An in-process [`Transport`] of threads and channels: the stand-in the reduction
//! algorithms are tested on without MPI. Training runs on MPI ([`crate::mpi_transport`]).
use crate::{CommError, Result, Transport};
use std::sync::mpsc::{channel, Receiver, Sender};

/// A message: f32 elements, or 16-bit ones.
enum Message {
    Floats(Vec<f32>),
    Halves(Vec<u16>),
}

pub struct LocalTransport {
    rank: usize,
    size: usize,
    /// `to[k]`: messages to rank k.
    to: Vec<Sender<Message>>,
    /// `from[k]`: messages from rank k.
    from: Vec<Receiver<Message>>,
}

impl LocalTransport {
    fn exchange(&self, send: Message, to: usize, from: usize) -> Result<Message> {
        let fail = |what: String| CommError::Transport { rank: self.rank, what };
        self.to[to].send(send).map_err(|_| fail(format!("rank {to} is gone")))?;
        self.from[from].recv().map_err(|_| fail(format!("rank {from} is gone")))
    }

    fn wrong(&self, len: usize, from: usize, got: usize) -> CommError {
        CommError::Buffer { rank: self.rank, len, what: format!("rank {from} sent {got} elements") }
    }
}

impl Transport for LocalTransport {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.size
    }
    fn send_receive(&self, send: &[f32], to: usize, recv: &mut [f32], from: usize) -> Result<()> {
        match self.exchange(Message::Floats(send.to_vec()), to, from)? {
            Message::Floats(got) if got.len() == recv.len() => recv.copy_from_slice(&got),
            Message::Floats(got) => return Err(self.wrong(recv.len(), from, got.len())),
            Message::Halves(got) => return Err(self.wrong(recv.len(), from, got.len())),
        }
        Ok(())
    }
    fn send_receive_halves(&self, send: &[u16], to: usize, recv: &mut [u16], from: usize) -> Result<()> {
        match self.exchange(Message::Halves(send.to_vec()), to, from)? {
            Message::Halves(got) if got.len() == recv.len() => recv.copy_from_slice(&got),
            Message::Halves(got) => return Err(self.wrong(recv.len(), from, got.len())),
            Message::Floats(got) => return Err(self.wrong(recv.len(), from, got.len())),
        }
        Ok(())
    }
}

/// `n` transports wired to each other (channels are unbounded, so a send never waits).
pub fn group(n: usize) -> Vec<LocalTransport> {
    // senders[i][k]: i -> k; receivers[k][i]: at k, from i.
    let mut senders: Vec<Vec<Sender<Message>>> = (0..n).map(|_| Vec::with_capacity(n)).collect();
    let mut receivers: Vec<Vec<Option<Receiver<Message>>>> = (0..n).map(|_| (0..n).map(|_| None).collect()).collect();
    for (i, row) in senders.iter_mut().enumerate() {
        for recv_row in receivers.iter_mut() {
            let (s, r) = channel();
            row.push(s);
            recv_row[i] = Some(r);
        }
    }
    senders
        .into_iter()
        .zip(receivers)
        .enumerate()
        .map(|(rank, (to, from))| LocalTransport { rank, size: n, to, from: from.into_iter().map(|r| r.expect("wired")).collect() })
        .collect()
}

/// Runs `f` on `n` ranks, one thread each, each given its transport; their results by
/// rank.
pub fn run<R: Send + 'static>(n: usize, f: impl Fn(LocalTransport) -> R + Send + Sync + 'static) -> Vec<R> {
    let f = std::sync::Arc::new(f);
    let handles: Vec<_> = group(n)
        .into_iter()
        .map(|t| {
            let f = f.clone();
            std::thread::spawn(move || f(t))
        })
        .collect();
    handles.into_iter().map(|h| h.join().expect("a rank panicked")).collect()
}

/// Runs `f` on `machines x per_machine` ranks, one thread each, as if `per_machine`
/// ranks shared each machine: rank `m * per_machine + l` gets its world rank, a
/// transport among the ranks of machine `m` (local rank `l`) and one among the ranks of
/// local index `l` on every machine (rank `m`). Results by world rank.
pub fn run_two_level<R: Send + 'static>(machines: usize, per_machine: usize, f: impl Fn(usize, LocalTransport, LocalTransport) -> R + Send + Sync + 'static) -> Vec<R> {
    let f = std::sync::Arc::new(f);
    let mut locals: Vec<Vec<Option<LocalTransport>>> = (0..machines).map(|_| group(per_machine).into_iter().map(Some).collect()).collect();
    let mut crosses: Vec<Vec<Option<LocalTransport>>> = (0..per_machine).map(|_| group(machines).into_iter().map(Some).collect()).collect();
    let mut handles = vec![];
    for m in 0..machines {
        for l in 0..per_machine {
            let (lt, ct) = (locals[m][l].take().expect("once"), crosses[l][m].take().expect("once"));
            let f = f.clone();
            handles.push(std::thread::spawn(move || f(m * per_machine + l, lt, ct)));
        }
    }
    handles.into_iter().map(|h| h.join().expect("a rank panicked")).collect()
}
