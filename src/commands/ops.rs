//! `kiln ops`: the operators Kiln implements (every one has a CPU and a WGSL kernel).
use anyhow::Result;

#[derive(clap::Args)]
pub struct Args {
    /// Print a JSON list of {domain, op} objects instead of one op per line.
    #[arg(long)]
    json: bool,
}

pub fn main(args: Args) -> Result<()> {
    let mut ops: Vec<(&str, &str)> = kiln::ops::Registry::builtin().op_types().collect();
    ops.sort();
    if args.json {
        let list: Vec<serde_json::Value> = ops.iter().map(|(d, o)| serde_json::json!({"domain": if d.is_empty() { "ai.onnx" } else { d }, "op": o})).collect();
        println!("{}", serde_json::to_string(&list)?);
    } else {
        for (d, o) in &ops {
            if d.is_empty() {
                println!("{o}");
            } else {
                println!("{d}.{o}");
            }
        }
        eprintln!("{} operators", ops.len());
    }
    Ok(())
}
