// Placeholder: the C ABI (flashopt.h), implemented for issue 4.
#include "flashopt/flashopt.h"
