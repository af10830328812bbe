// Throughput of MUFU's exp2 on the GPU: fp32 ex2.approx.ftz against packed ex2.approx.f16x2, alone and in the
// softmax's form (score * c - max * c, then exp2, then fp16 for P V). Session 53 (#14): is a packed fp16 exponent
// one MUFU op for two scores? Build and run: nvcc -arch=sm_90a -O3 -o /tmp/mufu mufu_ex2.cu && /tmp/mufu
#include <cstdio>
#include <cuda_fp16.h>
#define CHAINS 8
#define ITERS 4096

__device__ __forceinline__ float ex2f(float x) { float y; asm volatile("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x)); return y; }
__device__ __forceinline__ unsigned ex2h2(unsigned x) { unsigned y; asm volatile("ex2.approx.f16x2 %0, %1;" : "=r"(y) : "r"(x)); return y; }
__device__ __forceinline__ unsigned pack(float a, float b) { unsigned r; asm("cvt.rn.f16x2.f32 %0, %2, %1;" : "=r"(r) : "f"(a), "f"(b)); return r; }

__global__ void f32_only(float* out) {  // 2 exponents a step and chain, as many as f16x2's
  float v[CHAINS], w[CHAINS];
  for (int c = 0; c < CHAINS; ++c) { v[c] = -0.001f * (threadIdx.x + c); w[c] = v[c] * 0.5f; }
  for (int i = 0; i < ITERS; ++i)
#pragma unroll
    for (int c = 0; c < CHAINS; ++c) { v[c] = -ex2f(v[c]); w[c] = -ex2f(w[c]); }
  float s = 0; for (int c = 0; c < CHAINS; ++c) s += v[c] + w[c];
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}
__global__ void h2_only(float* out) {  // 2 exponents a step and chain, packed
  unsigned v[CHAINS];
  for (int c = 0; c < CHAINS; ++c) v[c] = pack(-0.001f * (threadIdx.x + c), -0.0005f * (threadIdx.x + c));
  for (int i = 0; i < ITERS; ++i)
#pragma unroll
    for (int c = 0; c < CHAINS; ++c) v[c] = ex2h2(v[c]) ^ 0x80008000u;  // negate both halves
  float s = 0; for (int c = 0; c < CHAINS; ++c) { __half2 h = *reinterpret_cast<__half2*>(&v[c]); s += __low2float(h) + __high2float(h); }
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}
// the softmax's form: 2 scores a step -> P (fp16x2) and the row sum (fp32)
__global__ void soft_f32(float* out, float cc, float mc) {
  float v[CHAINS], w[CHAINS], sum = 0; unsigned p = 0;
  for (int c = 0; c < CHAINS; ++c) { v[c] = 0.001f * (threadIdx.x + c); w[c] = v[c] * 0.5f; }
  for (int i = 0; i < ITERS; ++i)
#pragma unroll
    for (int c = 0; c < CHAINS; ++c) {
      float a = ex2f(v[c] * cc - mc), b = ex2f(w[c] * cc - mc);
      sum += a + b; p ^= pack(a, b); v[c] = a; w[c] = b; }
  out[blockIdx.x * blockDim.x + threadIdx.x] = sum + p;
}
__global__ void soft_h2(float* out, float cc, float mc) {
  float v[CHAINS], w[CHAINS], sum = 0; unsigned p = 0;
  for (int c = 0; c < CHAINS; ++c) { v[c] = 0.001f * (threadIdx.x + c); w[c] = v[c] * 0.5f; }
  for (int i = 0; i < ITERS; ++i)
#pragma unroll
    for (int c = 0; c < CHAINS; ++c) {
      unsigned e = ex2h2(pack(v[c] * cc - mc, w[c] * cc - mc));
      __half2 h = *reinterpret_cast<__half2*>(&e);
      float2 f = __half22float2(h);
      sum += f.x + f.y; p ^= e; v[c] = f.x; w[c] = f.y; }
  out[blockIdx.x * blockDim.x + threadIdx.x] = sum + p;
}

template <class F> float time_it(F launch) {
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  launch(); cudaDeviceSynchronize();
  float best = 1e30f;
  for (int r = 0; r < 5; ++r) { cudaEventRecord(a); launch(); cudaEventRecord(b); cudaEventSynchronize(b);
    float ms; cudaEventElapsedTime(&ms, a, b); best = ms < best ? ms : best; }
  return best;
}
int main() {
  int sms, clk; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  cudaDeviceGetAttribute(&clk, cudaDevAttrClockRate, 0);  // kHz
  int blocks = sms * 8, threads = 256;
  float* out; cudaMalloc(&out, blocks * threads * sizeof(float));
  double exps = double(blocks) * threads * ITERS * CHAINS * 2;
  auto rate = [&](float ms) { return exps / (ms * 1e-3) / (double(clk) * 1e3) / sms; };
  float t;
  t = time_it([&] { f32_only<<<blocks, threads>>>(out); }); printf("ex2.f32 alone      %.3f ms  %.2f exps/clk/SM\n", t, rate(t));
  t = time_it([&] { h2_only<<<blocks, threads>>>(out); }); printf("ex2.f16x2 alone    %.3f ms  %.2f exps/clk/SM\n", t, rate(t));
  t = time_it([&] { soft_f32<<<blocks, threads>>>(out, 0.18f, 0.5f); }); printf("softmax f32 exp    %.3f ms  %.2f exps/clk/SM\n", t, rate(t));
  t = time_it([&] { soft_h2<<<blocks, threads>>>(out, 0.18f, 0.5f); }); printf("softmax f16x2 exp  %.3f ms  %.2f exps/clk/SM\n", t, rate(t));
  printf("(clock %d MHz max, %d SMs; rates at the max clock)\n", clk / 1000, sms);
  return cudaGetLastError() != cudaSuccess;
}
