/*
 * ch_cuda_driver.h: CUDA driver entry points looked up through the runtime
 * (cudaGetDriverEntryPointByVersion, CUDA 12.0 ABI), so the library links no libcuda and loads
 * where there is no driver. CUDA builds only.
 */
#ifndef CHORUS_DEVICE_CH_CUDA_DRIVER_H_
#define CHORUS_DEVICE_CH_CUDA_DRIVER_H_

#ifdef __cplusplus
extern "C" {
#endif

#if CHORUS_HAVE_CUDA
/* The driver's function `name` (e.g. "cuMemCreate"), or NULL when the driver has none. */
void *ch_cuda_driver_entry(const char *name);
#endif

#ifdef __cplusplus
}
#endif

#endif
