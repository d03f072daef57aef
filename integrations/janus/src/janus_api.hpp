// The parts of Janus's public headers (janus-dev, /usr/include/janus) this handler uses, made
// includable from C++: glib and jansson first (their C++ guards hold templates, which may not
// sit inside extern "C"), then Janus's C headers inside extern "C". Janus's code is not copied
// here; the handler calls what the janus binary exports to event handlers (janus_vprintf,
// janus_config_*, janus_is_true) and nothing else.
#ifndef SFUREDIS_JANUS_API_HPP
#define SFUREDIS_JANUS_API_HPP

#include <glib.h>
#include <jansson.h>

extern "C" {
#include <config.h>
#include <debug.h>
#include <events/eventhandler.h>
#include <utils.h>
}

#endif // SFUREDIS_JANUS_API_HPP
