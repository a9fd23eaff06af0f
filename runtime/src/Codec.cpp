// Placeholder: implemented by the runtime work on issue 4.
#include "Codec.h"
