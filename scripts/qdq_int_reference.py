"""The exact integer result of the zoo's resnet18_int8_qdq (numpy, int64 sums): each QDQ
pattern computed as its integer op (QLinearConv, MaxPool on u8, QLinearAdd with MLAS's
f32 order, QLinearGlobalAveragePool, QGemm), requantized in f32 as onnxruntime's formulas
say.

Usage: python3 scripts/qdq_int_reference.py [--zoo ZOO_DIR] [--write OUT_DIR]
Prints, per data set, its relative L2 distance to the zoo's reference (onnxruntime's f32
emulation, optimizations off) and to onnxruntime with optimizations on (its integer
kernels). With --write, stores each data set's input and this exact output as
OUT_DIR/resnet18_int8_qdq/test_data_set_N/{input_0,output_0}.pb (scripts/test.sh does, for
tests/zoo.rs). ZOO_DIR defaults to $KILN_ZOO, else ../shared/zoo beside the repository."""
import argparse, os, shutil
import onnx, numpy as np
from onnx import numpy_helper as nh
ap=argparse.ArgumentParser()
here=os.path.dirname(os.path.abspath(__file__))
ap.add_argument('--zoo', default=os.environ.get('KILN_ZOO', os.path.join(here, '..', '..', 'shared', 'zoo')))
ap.add_argument('--write')
args=ap.parse_args()
M=os.path.join(args.zoo, 'resnet18_int8_qdq') + '/'
m=onnx.load(M+'model.onnx'); g=m.graph
init={i.name:nh.to_array(i) for i in g.initializer}
prod={o:n for n in g.node for o in n.output}
f32=np.float32
def rnd(v): return np.round(v)  # half to even
def attr(n,k,d=None):
    for a in n.attribute:
        if a.name==k: return onnx.helper.get_attribute_value(a)
    return d
def conv_int(xq,zx,w,stride,pad,k):
    N,C,H,W=xq.shape; M_=w.shape[0]
    xs=np.pad(xq.astype(np.int64)-zx,((0,0),(0,0),(pad,pad),(pad,pad)))
    OH=(H+2*pad-k)//stride+1; OW=(W+2*pad-k)//stride+1
    cols=np.empty((C,k,k,OH,OW),np.int64)
    for a in range(k):
        for b in range(k):
            cols[:,a,b]=xs[0,:,a:a+stride*OH:stride,b:b+stride*OW:stride]
    return (w.reshape(M_,-1).astype(np.int64)@cols.reshape(C*k*k,-1)).reshape(1,M_,OH,OW)
def exact(x):
    vals={}
    q=lambda v,s,z: np.clip(rnd(v.astype(f32)/f32(s))+z,0,255).astype(np.int64)
    # value -> (int tensor, scale, zp) in quant domain
    for n in g.node:
        if n.op_type=='QuantizeLinear' and n.input[0]=='x':
            vals[n.output[0]]=q(x,init[n.input[1]],init[n.input[2]])
        elif n.op_type=='QuantizeLinear':
            t=prod[n.input[0]]
            if t.op_type=='Flatten': vals[n.output[0]]=vals[t.output[0]]; continue
            ys,yz=f32(init[n.input[1]]),int(init[n.input[2]])
            dq=[prod[i] for i in t.input]
            xin=lambda d: vals[d.input[0]]
            if t.op_type=='Conv':
                dx,dw,db=dq
                sx,zx=f32(init[dx.input[1]]),int(init[dx.input[2]])
                w=init[dw.input[0]]; sw=init[dw.input[1]].astype(f32)
                b=init[db.input[0]]
                acc=conv_int(xin(dx),zx,w,attr(t,'strides')[0],attr(t,'pads')[0],attr(t,'kernel_shape')[0])+b.reshape(1,-1,1,1)
                mult=(sx*sw/ys).astype(f32).reshape(1,-1,1,1)
                vals[n.output[0]]=np.clip(rnd(acc.astype(f32)*mult)+yz,0,255).astype(np.int64)
            elif t.op_type=='MaxPool':
                a=vals[dq[0].input[0]]; 
                ap=np.pad(a,((0,0),(0,0),(1,1),(1,1)),constant_values=-1)
                OH=(a.shape[2]+2-3)//2+1
                o=np.full((1,a.shape[1],OH,OH),-1)
                for i in range(3):
                    for j in range(3): o=np.maximum(o,ap[:,:,i:i+2*OH:2,j:j+2*OH:2])
                vals[n.output[0]]=o
            elif t.op_type=='Add':
                da,db=dq
                As,Az=f32(init[da.input[1]]),f32(init[da.input[2]]); Bs,Bz=f32(init[db.input[1]]),f32(init[db.input[2]])
                ra=As/ys; rb=Bs/ys; fixed=f32(yz)-(ra*Az+rb*Bz)
                v=fixed+vals[da.input[0]].astype(f32)*ra+vals[db.input[0]].astype(f32)*rb
                vals[n.output[0]]=np.clip(rnd(v),0,255).astype(np.int64)
            elif t.op_type=='GlobalAveragePool':
                d=dq[0]; s,z=f32(init[d.input[1]]),int(init[d.input[2]])
                a=vals[d.input[0]]; N=a.shape[2]*a.shape[3]
                acc=a.sum(axis=(2,3),keepdims=True)-z*N
                vals[n.output[0]]=np.clip(rnd(acc.astype(f32)*(s/(ys*f32(N)))),0,255)+yz
            elif t.op_type=='Gemm':
                da,dw,db=dq
                sa,za=f32(init[da.input[1]]),int(init[da.input[2]])
                a=vals[da.input[0]].reshape(1,-1)-za
                w=init[dw.input[0]].astype(np.int64); sw=init[dw.input[1]].astype(f32)
                acc=a@w.T+init[db.input[0]]
                vals[n.output[0]]=np.clip(rnd(acc.astype(f32)*((f32(1)*sa*sw).astype(f32)/ys))+yz,0,255)
            else: raise Exception(t.op_type)
        elif n.op_type=='Flatten':
            vals[n.output[0]]=vals[prod[n.input[0]].input[0]].reshape(1,-1)
        elif n.op_type=='DequantizeLinear' and n.output[0]=='logits':
            out=(vals[n.input[0]].astype(f32)-int(init[n.input[2]]))*init[n.input[1]]
    return out

rel=lambda a,b: np.linalg.norm(a-b)/np.linalg.norm(b)
sess=None
for d in sorted(e for e in os.listdir(M) if e.startswith('test_data_set_')):
    x=nh.to_array(onnx.load_tensor(os.path.join(M, d, 'input_0.pb')))
    ref=nh.to_array(onnx.load_tensor(os.path.join(M, d, 'output_0.pb')))
    out=exact(x).astype(f32)
    if args.write:
        od=os.path.join(args.write, 'resnet18_int8_qdq', d)
        os.makedirs(od, exist_ok=True)
        shutil.copyfile(os.path.join(M, d, 'input_0.pb'), os.path.join(od, 'input_0.pb'))
        t=nh.from_array(out, 'logits')
        with open(os.path.join(od, 'output_0.pb'), 'wb') as f: f.write(t.SerializeToString())
        print(f'{d}: exact int vs ref(f32 QDQ, opt off): {rel(out,ref):.3e}; written to {od}')
        continue
    import onnxruntime as ort
    if sess is None:
        so=ort.SessionOptions(); so.graph_optimization_level=ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        sess=ort.InferenceSession(M+'model.onnx',so,providers=['CPUExecutionProvider'])
    y=sess.run(None,{'x':x})[0]
    print(f'{d}: exact int vs ref(f32 QDQ, opt off): {rel(out,ref):.3e}; exact int vs ort ENABLE_ALL: {rel(out,y):.3e}; ort all vs ref {rel(y,ref):.3e}')
