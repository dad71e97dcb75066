//! Builds the tiny CNN sample in code and runs it on the CPU and, if there is one, a GPU.
//! `cargo run --release -p kiln-samples --example run_sample`
use kiln_runtime::{DeviceChoice, Session, SessionOptions};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let graph = kiln_samples::tiny_cnn(96, 10, 7)?;
    let image = kiln_samples::Rng::new(1).tensor(&[1, 3, 96, 96], 1.0)?;
    for device in [DeviceChoice::Cpu, DeviceChoice::Gpu] {
        match Session::new(graph.clone(), SessionOptions::device(device.clone())) {
            Ok(s) => {
                let out = s.run(&[("image", &image)])?;
                let p = out[0].as_slice::<f32>()?;
                let best = p.iter().enumerate().fold((0, f32::MIN), |a, (i, &v)| if v > a.1 { (i, v) } else { a });
                println!("{}: class {} with p = {:.4}", s.device_name(), best.0, best.1);
            }
            Err(e) => println!("{device}: {e}"),
        }
    }
    Ok(())
}
