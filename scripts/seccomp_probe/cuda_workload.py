"""What a vLLM GPU worker does with CUDA, in small: cuBLAS matmuls, pinned host memory (cudaHostAlloc, the
CPU KV tier's kind) and async copies, a CUDA graph, NCCL (one rank: TCP bootstrap, getifaddrs), a Triton
kernel (JIT: ptxas and a C compiler as subprocesses) and a worker process started with spawn, as vLLM starts
its workers. Compact on purpose (it travels inside one command); run under probe.c."""
# ruff: noqa: E401, E501, E702, I001
import multiprocessing as mp,os,torch
def wk(q):
    x=torch.ones(512,512,device="cuda");q.put(float((x@x).sum()))
if __name__=="__main__":
    a=torch.randn(4096,4096,device="cuda",dtype=torch.bfloat16);b=a@a
    p=torch.empty(256<<20,dtype=torch.uint8).pin_memory();d=p.to("cuda",non_blocking=True);p.copy_(d,non_blocking=True);torch.cuda.synchronize()
    g=torch.cuda.CUDAGraph();s=torch.cuda.Stream();s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        c=a@b
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g):
        c=a@b
    g.replay();torch.cuda.synchronize()
    import torch.distributed as dist
    os.environ.update(MASTER_ADDR="127.0.0.1",MASTER_PORT="29533");dist.init_process_group("nccl",rank=0,world_size=1);t=torch.ones(8,device="cuda");dist.all_reduce(t);torch.cuda.synchronize();dist.destroy_process_group()
    import triton,triton.language as tl
    @triton.jit
    def k(x,o,n,B:tl.constexpr):
        i=tl.program_id(0)*B+tl.arange(0,B);m=i<n;tl.store(o+i,tl.load(x+i,mask=m)*2,mask=m)
    x=torch.randn(1<<20,device="cuda");o=torch.empty_like(x);k[(1024,)](x,o,x.numel(),B=1024);torch.cuda.synchronize();assert torch.allclose(o,2*x)
    q=mp.get_context("spawn").Queue();w=mp.get_context("spawn").Process(target=wk,args=(q,));w.start();r=q.get(timeout=300);w.join(60)
    print("workload ok",torch.cuda.get_device_name(0),float(t.sum()),r,w.exitcode)
