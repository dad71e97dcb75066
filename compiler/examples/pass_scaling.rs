//! Benchmark: time of each default pass on long chains of nodes (the passes must stay
//! linear or n log n in the number of nodes). Prints one line per pass and size.
//!   cargo run --release -p kiln-compiler --example pass_scaling -- 20000 200000
use kiln_compiler::passes::{self, PassContext, Target};
use kiln_graph::{DType, GraphBuilder, Shape, Tensor};
use std::time::Instant;

/// x -> (Relu -> Add(., w) -> Identity -> Mul(., w) -> Reshape(same) -> Cast(f32))* :
/// elementwise chains over a weight with no-op nodes between, as exporters leave them.
fn chain(nodes: usize) -> kiln_graph::Graph {
    let mut b = GraphBuilder::new("chain");
    let mut v = b.input("x", DType::F32, Shape::fixed(&[1, 16]));
    let w = b.constant("w", Tensor::from_vec(&[16], vec![0.5f32; 16]).unwrap());
    let shape = b.constant("shape", Tensor::from_vec(&[2], vec![1i64, 16]).unwrap());
    for i in 0..nodes {
        v = match i % 6 {
            0 => b.node("Relu", &[v], &[]),
            1 => b.node("Add", &[v, w], &[]),
            2 => b.node("Identity", &[v], &[]),
            3 => b.node("Mul", &[v, w], &[]),
            4 => b.node("Reshape", &[v, shape], &[]),
            _ => b.node("Cast", &[v], &[("to", kiln_graph::Attr::Int(1))]),
        };
    }
    b.output(v);
    let mut g = b.finish().unwrap();
    g.opsets.insert(String::new(), 17);
    g
}

fn main() {
    let sizes: Vec<usize> = std::env::args().skip(1).map(|a| a.parse().expect("a node count")).collect();
    let sizes = if sizes.is_empty() { vec![2_000, 20_000, 200_000] } else { sizes };
    for n in sizes {
        let mut g = chain(n);
        let mut cx = PassContext::builtin();
        let all = Instant::now();
        for p in passes::selected_passes("", "", Target::Cpu) {
            let t = Instant::now();
            let changes = (p.run)(&mut g, &mut cx);
            println!("{n:>8} nodes  {:<20} {:>9.1} ms  {changes} changes", p.name, t.elapsed().as_secs_f64() * 1e3);
        }
        println!("{n:>8} nodes  {:<20} {:>9.1} ms  ({} inference(s), {} nodes left)", "all passes", all.elapsed().as_secs_f64() * 1e3, cx.inferences(), g.nodes.len());
    }
}
